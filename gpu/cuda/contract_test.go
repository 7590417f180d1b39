package cuda

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/gputest"
)

// TestKernelContract runs every kernel against its float64 host replay
// (package gputest: fresh random inputs, ragged shapes, strided views,
// poisoned outputs), then recompiles the kernels once per planted fault
// (Faults) and requires the same checks to catch each one. It prints one
// summary line: checks passed, controls caught.
func TestKernelContract(t *testing.T) {
	d := openGPU(t)
	rep := gputest.Run(d, 20261201)
	for _, c := range rep.Failed() {
		t.Errorf("%s %s: err %g > bound %g %s", c.Op, c.Case, c.Err, c.Bound, c.Detail)
	}
	// The tensor-core products (MatMul "mma", the default; openGPU's
	// device runs the FMA kernels) pass the same contract.
	md, err := New(Options{MatMul: "mma"})
	if err != nil {
		t.Fatal(err)
	}
	mrep := gputest.RunWith(md, 20261201, gputest.Options{TensorCoreMatMul: true})
	md.Close()
	for _, c := range mrep.Failed() {
		if c.Op == "matmul" {
			t.Errorf("mma: %s %s: err %g > bound %g %s", c.Op, c.Case, c.Err, c.Bound, c.Detail)
		}
	}
	names := make([]string, 0, len(Faults))
	for f := range Faults {
		names = append(names, f)
	}
	sort.Strings(names)
	// Compile the controls in parallel into the disk cache first.
	var wg sync.WaitGroup
	for _, f := range names {
		wg.Go(func() {
			if err := d.precompile("", f); err != nil {
				t.Errorf("compile with fault %s: %v", f, err)
			}
		})
	}
	wg.Wait()
	caught := 0
	for _, f := range names {
		op := Faults[f]
		o := Options{Fault: f, MatMul: "mma"}
		if f == "MATMUL" || f == "GEMV" {
			o.MatMul = "fma" // faults in the FMA kernels' BF16 paths
		}
		fd, err := New(o)
		if err != nil {
			t.Errorf("fault %s: %v", f, err)
			continue
		}
		var fr gputest.Report
		var missed bool
		if op == "fused" {
			missed = checkFused(fd) == nil
		} else {
			fr = gputest.RunWith(fd, 20261201, gputest.Options{TensorCoreMatMul: o.MatMul == "mma"})
			missed = !fr.FailedOps()[op]
		}
		fd.Close()
		if !missed {
			caught++
		} else {
			t.Errorf("planted fault %s in %s was not caught (%s)", f, op, fr.Summary())
		}
	}
	line := fmt.Sprintf("kernel contract on %s: %s (FMA matmul), %s (tensor-core matmul, the default); planted faults caught %d/%d", d.Info().Name, rep.Summary(), mrep.Summary(), caught, len(names))
	t.Log(line)
	fmt.Fprintln(os.Stderr, line)
}

// precompile compiles the kernels with a planted fault into the disk cache
// (the contract's controls compile in parallel before their devices open).
func (d *Device) precompile(cacheDir, fault string) error {
	opts := compileOptions(d.arch, fault)
	_, _, err := d.nv.Compile(kernelSource, opts, cachePath(cacheDir, cacheKey(kernelSource, opts, d.drvVer, d.nvVer)))
	return err
}
