package conformer

import (
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

const (
	fixtureDir = "../../testdata/lfm2-audio-tiny/"
	refFile    = "../../testdata/conformer-ref/ref.safetensors"
)

// newDevice returns a CPU device closed at the end of the test.
func newDevice(t testing.TB) gpu.Device {
	dev := cpu.New(2)
	t.Cleanup(func() { dev.Close() })
	return dev
}

// openFile opens a safetensors file closed at the end of the test.
func openFile(t testing.TB, path string) *safetensors.File {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// loadFixture loads the tiny reference model's encoder and adapter and
// checks that every conformer and adapter tensor was bound or skipped.
func loadFixture(t testing.TB, dev gpu.Device) *Encoder {
	t.Helper()
	cfg, err := config.ReadAudio(fixtureDir + "config.json")
	if err != nil {
		t.Fatal(err)
	}
	b := weights.New(dev, openFile(t, fixtureDir+"model.safetensors"))
	e, err := Load(b, cfg.Encoder, cfg.LFM.HiddenSize)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range b.Unexpected() {
		if strings.HasPrefix(n, "conformer.") || strings.HasPrefix(n, "audio_adapter.") {
			t.Errorf("encoder tensor %s was neither bound nor skipped", n)
		}
	}
	return e
}

// values reads a float tensor and its shape.
func values(t testing.TB, f *safetensors.File, name string) ([]float32, []int) {
	t.Helper()
	ts, err := f.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ts.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v, ts.Shape
}

// values64 reads an F64 tensor.
func values64(t testing.TB, f *safetensors.File, name string) []float64 {
	t.Helper()
	ts, err := f.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ts.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// caseMel returns a fixture case's mel time-major, [T_mel, feat_in], and
// its shape.
func caseMel(t testing.TB, f *safetensors.File) (mel []float32, frames, feats int) {
	t.Helper()
	v, shape := values(t, f, "mel") // [feat_in, T_mel]
	feats, frames = shape[0], shape[1]
	return transpose(v, feats, frames), frames, feats
}

// transpose returns the [cols, rows] transpose of a row-major [rows, cols]
// matrix.
func transpose(v []float32, rows, cols int) []float32 {
	out := make([]float32, len(v))
	for r := range rows {
		for c := range cols {
			out[c*rows+r] = v[r*cols+c]
		}
	}
	return out
}

// upload writes host values into a [rows, cols] scratch tensor of c.
func upload(c *nn.Ctx, v []float32, rows, cols int) gpu.Tensor {
	x := c.Tmp(rows, cols)
	c.Q.Write(x, v)
	return x
}

// download reads a tensor back.
func download(t testing.TB, c *nn.Ctx, x gpu.Tensor) []float32 {
	t.Helper()
	v := make([]float32, x.Len())
	if err := c.Q.Read(v, x); err != nil {
		t.Fatal(err)
	}
	return v
}

// run encodes mel [frames, feats] at precision p and returns the encoder
// and adapter outputs.
func run(t testing.TB, e *Encoder, dev gpu.Device, p nn.Precision, mel []float32, frames int) (enc, out []float32) {
	t.Helper()
	c := nn.NewCtx(dev, dev.NewQueue("test"), p)
	defer c.A.Free()
	x := e.Encode(c, upload(c, mel, frames, e.Cfg.FeatIn))
	y := e.Adapt(c, x)
	if x.Rows != e.OutLen(frames) || y.Rows != x.Rows || x.Cols != e.FeatOut || y.Cols != e.Hidden {
		t.Fatalf("%d frames: encoder %v, adapter %v; want %d rows of %d and %d", frames, x, y, e.OutLen(frames), e.FeatOut, e.Hidden)
	}
	return download(t, c, x), download(t, c, y)
}

// bf16ULPs returns how many elements of got differ from want (both bf16
// values) and the largest difference in bf16 units in the last place.
func bf16ULPs(got, want []float32) (differ, maxULP int) {
	for i := range got {
		a, b := int(int16(gpu.F32ToBF16(got[i]))), int(int16(gpu.F32ToBF16(want[i])))
		// Order the bit patterns as integers (sign-magnitude to two's complement).
		if a < 0 {
			a = -0x8000 - a
		}
		if b < 0 {
			b = -0x8000 - b
		}
		if d := max(a-b, b-a); d > 0 {
			differ++
			maxULP = max(maxULP, d)
		}
	}
	return differ, maxULP
}
