package cuda

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu/gputest"
)

// TestKernelContract runs every kernel against its float64 host replay
// (package gputest: fresh random inputs, ragged shapes, strided views,
// poisoned outputs), then recompiles the kernels once per planted fault
// (Faults) and requires the same checks to catch each one. It prints one
// summary line: checks passed, controls caught.
//
// Every kernel the backend's shape rules can pick must be launched by the
// two runs (a kernel the contract does not reach is not checked: since
// b77454d the tensor cores' 64 × 64 tile kernel, and since the FMA tile
// kernel's short-K rule was dropped its kernels, were not, and their
// planted faults passed unseen, which the CUDA emulator showed first).
// The variants only tests and benchmarks force (forcedOnlyVariants) are
// held to the kernels the backend picks bit for bit instead, by
// TestGemvVariantsBitIdentical and its siblings.
func TestKernelContract(t *testing.T) {
	d := openGPU(t)
	stop := d.countLaunches()
	start := time.Now()
	rep := gputest.Run(d, 20261201)
	launched := stop()
	// Each part's summary as it ends (-v streams it): a run cut short
	// still says how far it got.
	t.Logf("FMA matmul: %s (%.1f s since the device opened, kernels %s)", rep.Summary(), time.Since(start).Seconds(), d.KernelSource())
	for _, c := range rep.Failed() {
		t.Errorf("%s %s: err %g > bound %g %s", c.Op, c.Case, c.Err, c.Bound, c.Detail)
	}
	// The tensor-core products (MatMul "mma", the default; openGPU's
	// device runs the FMA kernels) pass the same contract.
	md, err := New(Options{MatMul: "mma", FusedBlock: true}) // the fused block's checks too
	if err != nil {
		t.Fatal(err)
	}
	stop = md.countLaunches()
	mrep := gputest.RunWith(md, 20261201, gputest.Options{TensorCoreMatMul: true})
	t.Logf("tensor-core matmul: %s (prompt products on %q; %.1f s)", mrep.Summary(), md.PromptGEMM(), time.Since(start).Seconds())
	for k, n := range stop() {
		launched[k] += n
	}
	md.Close()
	for _, c := range mrep.Failed() {
		if c.Op == "matmul" || c.Op == "normglu" || c.Op == "matmulprompt" { // the ops whose checks state the tensor cores' bound (the prompt products: cuBLAS there)
			t.Errorf("mma: %s %s: err %g > bound %g %s", c.Op, c.Case, c.Err, c.Bound, c.Detail)
		}
	}
	forced := forcedOnlyVariants()
	for _, k := range kernelNames {
		if launched[k] == 0 && !forced[k] {
			t.Errorf("the contract never launches %s, which the backend picks for some shapes: no float64 replay checks it", k)
		}
	}
	names := make([]string, 0, len(Faults))
	for f := range Faults {
		names = append(names, f)
	}
	sort.Strings(names)
	// Compile the controls in parallel into the disk cache first (as many
	// at once as there are cores: on the emulator each is a C++ compile).
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.NumCPU())
	for _, f := range names {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := d.precompile("", f); err != nil {
				t.Errorf("compile with fault %s: %v", f, err)
			}
		})
	}
	wg.Wait()
	// Each control runs on a device of its own: one after another on a
	// GPU, as many at once as there are cores on the emulator (whose
	// kernels run on the owner's thread).
	workers := 1
	if d.Emulated() {
		workers = runtime.NumCPU()
	}
	var caught atomic.Int32
	sem = make(chan struct{}, workers)
	for _, f := range names {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if msg := runControl(f); msg != "" {
				t.Error(msg)
			} else {
				caught.Add(1)
			}
		})
	}
	wg.Wait()
	line := fmt.Sprintf("kernel contract on %s: %s (FMA matmul), %s (tensor-core matmul, the default); planted faults caught %d/%d", d.Info().Name, rep.Summary(), mrep.Summary(), caught.Load(), len(names))
	t.Log(line)
	fmt.Fprintln(os.Stderr, line)
}

// runControl opens a device with the planted fault f and runs the check of
// the op it is planted in; it returns "" when the check caught it, else
// what went wrong.
func runControl(f string) string {
	op := Faults[f]
	o := Options{Fault: f, MatMul: "mma", FusedBlock: true}
	if f == "MATMUL" || f == "GEMV" {
		o.MatMul = "fma" // faults in the FMA kernels' BF16 paths
	}
	fd, err := New(o)
	if err != nil {
		return fmt.Sprintf("fault %s: %v", f, err)
	}
	defer fd.Close()
	if op == "fused" {
		if checkFused(fd) == nil {
			return fmt.Sprintf("planted fault %s in the fused ops was not caught", f)
		}
		return ""
	}
	// Only the op the fault is planted in: the check that must catch it.
	fr := gputest.RunWith(fd, 20261201, gputest.Options{TensorCoreMatMul: o.MatMul == "mma", Ops: []string{op}})
	if !fr.FailedOps()[op] {
		return fmt.Sprintf("planted fault %s in %s was not caught (%s)", f, op, fr.Summary())
	}
	return ""
}

// precompile compiles the kernels with a planted fault into the disk cache
// (the contract's controls compile in parallel before their devices open).
func (d *Device) precompile(cacheDir, fault string) error {
	opts := d.moduleOptions(fault)
	_, _, err := compileCached(d.nv, nil, d.arch, kernelSource, opts, cachePath(cacheDir, cacheKey(kernelSource, opts, d.drvVer, d.nvVer)))
	return err
}

// forcedOnlyVariants returns the product kernels that the backend's shape
// rules never pick (alternatives that benchmarks and the bit-identity
// tests force): every variant of the tables minus what the selectors
// return over the shapes where their choices change.
func forcedOnlyVariants() map[string]bool {
	all := map[string]bool{}
	for _, v := range gemvVariants {
		all[v.name] = true
	}
	for _, v := range gemvrVariants {
		all[v.name] = true
	}
	for _, v := range mmvVariants {
		all[v.name] = true
		all[mmvTiledName(v.name)] = true
	}
	for _, v := range mmvNormVariants {
		all[v.name] = true
	}
	for _, n := range gemvnKernels {
		if n != "" {
			all[n] = true
		}
	}
	for _, N := range []int{1, 2104, 2105, 4208, 4209, 1 << 20} {
		for _, K := range []int{1, 2047, 2048} {
			name, rows := gemvVariant(N, K)
			delete(all, name)
			delete(all, gemvnKernels[rows/4])
		}
	}
	for M := 2; M <= gemvrMaxRows; M++ {
		delete(all, gemvrVariant(M).name)
	}
	for _, N := range []int{1, 2048, 2049, mmvMaxN} {
		delete(all, mmvVariant(N).name)
		delete(all, mmvTiledName(mmvVariant(N).name))
	}
	for _, sh := range []struct{ M, N, K int }{{17, 33, 300}, {17, 33, 4100}} {
		if v, ok := mmvMidVariant(sh.M, sh.N, sh.K, 132); ok {
			delete(all, v.name)
			delete(all, mmvTiledName(v.name))
		}
	}
	delete(all, mmvNormDefault.name)
	// The five-phase block kernels run only as one grid or with
	// Options.OneKernelBlock; TestStdBlockEqualsSeq holds both, launched
	// either way, to the op sequence (and so to the kernels of one phase
	// each, which the contract checks) bit for bit.
	all["std_block_f32"], all["std_blockt_f32"] = true, true
	// mma_tile's 32-row blocks: since the 64 × 64 tiles split their
	// classes over blocks where they are few (mmaBigSplit) they take every
	// product of mmaBigMinRows rows or more; the 8- and 16-row blocks of
	// the same code are picked and checked, and the bit-identity tests
	// hold the tile kernels to this one (TestMmaBigBitIdentical,
	// TestMmvVariantsBitIdentical, …).
	all["mma_bf16_m32"] = true
	return all
}

// TestContractUnderShuffledSchedule (the emulator only) runs the contract's
// checks with the threads of each block resumed in a random order between
// barriers (OMNIPIPE_CUDA_EMU_SCHEDULE): a kernel that reads what another
// thread of its block writes without a barrier between them fails there,
// though the thread-order schedule happens to hide it.
func TestContractUnderShuffledSchedule(t *testing.T) {
	if !openGPU(t).Emulated() {
		t.Skip("the schedule is the emulator's: a GPU's warps run in its own order")
	}
	t.Setenv("OMNIPIPE_CUDA_EMU_SCHEDULE", "random:20261201")
	for _, mm := range []string{"fma", "mma"} {
		d, err := New(Options{MatMul: mm, FusedBlock: true})
		if err != nil {
			t.Fatal(err)
		}
		rep := gputest.RunWith(d, 20261202, gputest.Options{TensorCoreMatMul: mm == "mma"})
		d.Close()
		for _, c := range rep.Failed() {
			t.Errorf("%s: %s %s: err %g > bound %g %s", mm, c.Op, c.Case, c.Err, c.Bound, c.Detail)
		}
		t.Logf("%s products, shuffled schedule: %s", mm, rep.Summary())
	}
}
