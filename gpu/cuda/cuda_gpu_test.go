package cuda

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// The tests in this file need an NVIDIA GPU with its driver and NVRTC; on
// other machines they are skipped with the reason.

var (
	gpuOnce sync.Once
	gpuDev  *Device
	gpuErr  error
)

// openGPU returns the shared test device, or skips the test.
func openGPU(t testing.TB) *Device {
	t.Helper()
	gpuOnce.Do(func() { gpuDev, gpuErr = New(Options{}) })
	if gpuErr != nil {
		if errors.Is(gpuErr, ErrNoDriver) || errors.Is(gpuErr, errNoGPU) {
			t.Skipf("no usable GPU: %v", gpuErr)
		}
		t.Fatalf("the GPU is there but the backend failed: %v", gpuErr)
	}
	return gpuDev
}

func TestDeviceOpens(t *testing.T) {
	d := openGPU(t)
	in := d.Info()
	t.Logf("device %s; %s; kernels %s; memory %d MiB", in.Name, in.Driver, d.KernelSource(), in.MemTotal>>20)
	if in.Kind != "cuda" || in.MemTotal <= 0 || d.Arch() == "" {
		t.Errorf("info %+v", in)
	}
}

// TestMatchesCPUBackend runs a small mixed sequence of ops on both
// backends and compares the results (a smoke test: the per-kernel
// contract with float64 replays is in contract_test.go).
func TestMatchesCPUBackend(t *testing.T) {
	d := openGPU(t)
	c := cpu.New(2)
	defer c.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.Float64()*2 - 1)
		}
		return v
	}
	const M, K, N = 5, 300, 37
	xs, ws := rnd(M*K), rnd(N*K)
	wb := make([]byte, 2*len(ws))
	for i, v := range ws {
		h := gpu.F32ToBF16(v)
		wb[2*i], wb[2*i+1] = byte(h), byte(h>>8)
	}
	run := func(dev gpu.Device) []float32 {
		q := dev.NewQueue("t")
		x := dev.Alloc(gpu.F32, M, K)
		w, err := dev.Load(gpu.BF16, N, K, wb)
		if err != nil {
			t.Fatal(err)
		}
		y := dev.Alloc(gpu.F32, M, N)
		q.Write(x, xs)
		q.MatMul(y, x, w, gpu.Tensor{})
		q.RMSNorm(y, y, 1e-5)
		q.Act(y, y, gpu.SiLU)
		q.RoundBF16(y)
		out := make([]float32, M*N)
		if err := q.Read(out, y); err != nil {
			t.Fatal(err)
		}
		return out
	}
	g, h := run(d), run(c)
	var worst float64
	for i := range g {
		worst = math.Max(worst, math.Abs(float64(g[i]-h[i])))
	}
	t.Logf("max |gpu − cpu| = %g", worst)
	if worst > 1e-2 || math.IsNaN(worst) {
		t.Errorf("GPU and CPU differ by %g", worst)
	}
}
