package cuda

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

// profiler times every kernel on the GPU (Options.Profile, env
// OMNIPIPE_CUDA_PROFILE): batches launch kernel by kernel (no graphs), an
// event pair around each, and the elapsed times are summed per kernel and
// launch shape. Meant for finding where a step's time goes, not for
// production: the events add a little time per kernel, graphs are off.
type profiler struct {
	elapsed uintptr // cuEventElapsedTime
	mu      sync.Mutex
	rows    map[profKey]*ProfileRow
	events  []uintptr // owner thread only
}

type profKey struct {
	queue, name string
	grid        [3]uint32
}

// ProfileRow is one kernel and launch shape's total.
type ProfileRow struct {
	Queue  string // the queue (stage) that launched it
	Kernel string
	Grid   [3]uint32
	Calls  int
	Time   time.Duration
}

// Profile returns the profile collected so far, the costliest first; nil
// when profiling is off.
func (d *Device) Profile() []ProfileRow {
	p := d.prof
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	rows := make([]ProfileRow, 0, len(p.rows))
	for _, r := range p.rows {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b ProfileRow) int {
		return cmp.Or(cmp.Compare(b.Time, a.Time), cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Kernel, b.Kernel))
	})
	return rows
}

// WriteProfile writes the profile as a table.
func WriteProfile(w io.Writer, rows []ProfileRow) {
	var total time.Duration
	calls := 0
	perQ := map[string]*ProfileRow{}
	var queues []string
	for _, r := range rows {
		total += r.Time
		calls += r.Calls
		q := perQ[r.Queue]
		if q == nil {
			q = &ProfileRow{Queue: r.Queue}
			perQ[r.Queue] = q
			queues = append(queues, r.Queue)
		}
		q.Calls += r.Calls
		q.Time += r.Time
	}
	fmt.Fprintf(w, "CUDA kernel profile: %d launches, %.3f ms of kernel time\n", calls, float64(total)/1e6)
	slices.Sort(queues)
	for _, name := range queues {
		q := perQ[name]
		fmt.Fprintf(w, "  queue %-14s %8d launches %12.3f ms\n", name, q.Calls, float64(q.Time)/1e6)
	}
	fmt.Fprintf(w, "%-14s %-18s %-16s %8s %12s %10s %6s\n", "queue", "kernel", "grid", "calls", "total ms", "mean µs", "share")
	for _, r := range rows {
		fmt.Fprintf(w, "%-14s %-18s %-16s %8d %12.3f %10.2f %5.1f%%\n", r.Queue, r.Kernel, fmt.Sprintf("%dx%dx%d", r.Grid[0], r.Grid[1], r.Grid[2]),
			r.Calls, float64(r.Time)/1e6, float64(r.Time)/1e3/float64(r.Calls), 100*float64(r.Time)/float64(max(total, 1)))
	}
}

// newProfiler resolves cuEventElapsedTime.
func newProfiler(c *driver) (*profiler, error) {
	for _, name := range []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"} {
		if p, err := purego.Dlsym(c.h, name); err == nil {
			return &profiler{elapsed: p, rows: map[profKey]*ProfileRow{}}, nil
		}
	}
	return nil, fmt.Errorf("cuda: profiling needs cuEventElapsedTime, which libcuda.so.1 lacks")
}

// launchProfiled launches r's commands one by one with an event pair
// around each kernel, waits, and adds the times (owner thread).
func (q *Queue) launchProfiled(r *batch) error {
	p, c := q.d.prof, q.d.drv
	need := 0
	for _, cm := range r.cmds {
		if cm.free == 0 {
			need += 2
		}
	}
	for len(p.events) < need {
		var ev uintptr
		if err := c.call("cuEventCreate", c.cuEventCreate, uintptr(unsafe.Pointer(&ev)), 0); err != nil {
			return err
		}
		p.events = append(p.events, ev)
	}
	type launched struct {
		key    profKey
		ev0, e int
	}
	var done []launched
	k := 0
	for _, cm := range r.cmds {
		if cm.free != 0 {
			if err := c.call("cuMemFreeAsync", c.cuMemFreeAsync, cm.free, q.stream); err != nil {
				return err
			}
			continue
		}
		if err := c.call("cuEventRecord", c.cuEventRecord, p.events[k], q.stream); err != nil {
			return err
		}
		if err := q.launchCmd(cm); err != nil {
			return err
		}
		if err := c.call("cuEventRecord", c.cuEventRecord, p.events[k+1], q.stream); err != nil {
			return err
		}
		name := q.d.fnNames[cm.fn]
		if cm.gemm != nil {
			name = fmt.Sprintf("cublasGemmEx_bf16 %d×%d×%d", cm.gemm.n, cm.gemm.m, cm.gemm.k)
		}
		done = append(done, launched{profKey{q.name, name, cm.grid}, k, k + 1})
		k += 2
	}
	if err := c.call("cuStreamSynchronize", c.cuStreamSynchronize, q.stream); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range done {
		var ms float32
		if res, _, _ := purego.SyscallN(p.elapsed, uintptr(unsafe.Pointer(&ms)), p.events[l.ev0], p.events[l.e]); res != 0 {
			return c.err("cuEventElapsedTime", result(res))
		}
		row := p.rows[l.key]
		if row == nil {
			row = &ProfileRow{Queue: l.key.queue, Kernel: l.key.name, Grid: l.key.grid}
			p.rows[l.key] = row
		}
		row.Calls++
		row.Time += time.Duration(float64(ms) * 1e6)
	}
	return nil
}

// writeProfileFile writes the profile to the file OMNIPIPE_CUDA_PROFILE
// names ("-" or "1": standard error) when the device closes.
func (d *Device) writeProfileFile() {
	if d.prof == nil || d.profPath == "" {
		return
	}
	rows := d.Profile()
	if d.profPath == "-" || d.profPath == "1" {
		WriteProfile(os.Stderr, rows)
		return
	}
	f, err := os.Create(d.profPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cuda: profile: %v\n", err)
		return
	}
	WriteProfile(f, rows)
	if err := f.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "cuda: profile: %v\n", err)
	}
}
