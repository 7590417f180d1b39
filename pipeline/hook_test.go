package pipeline

import (
	"sync"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// codecQueue is the name stages/mimi gives the queue the codec stage runs
// on (the other stages' queues are named after the stages).
const codecQueue = "mimi"

// hookCall is an op a hookDev is about to run.
type hookCall struct {
	Queue string // the queue's name, or "device" for Free
	Op    string // "Read", "Embed" or "Free"
	N     int    // the queue's calls of Op so far, this one included
	IDs   []int32
	Rows  int // Embed's destination rows
	Len   int // Read's and ReadInt's destination length (the values read)
}

// hookDev is a gpu.Device whose queues call on before every Read and
// Embed, on the goroutine that submits the op, and which calls it before
// every Free: a test acts inside a stage with it (fails a read as a GPU
// backend's can, panics, or blocks). What on returns for a Read is that
// Read's error (the op does not run); otherwise it is ignored.
type hookDev struct {
	gpu.Device
	on func(hookCall) error

	mu    sync.Mutex
	calls map[string]int
}

func newHookDev(dev gpu.Device, on func(hookCall) error) *hookDev {
	return &hookDev{Device: dev, on: on, calls: map[string]int{}}
}

func (d *hookDev) NewQueue(name string) gpu.Queue {
	return &hookQueue{Queue: d.Device.NewQueue(name), d: d, name: name}
}

func (d *hookDev) Free(t gpu.Tensor) {
	d.call(hookCall{Queue: "device", Op: "Free"})
	d.Device.Free(t)
}

func (d *hookDev) call(c hookCall) error {
	d.mu.Lock()
	d.calls[c.Queue+"."+c.Op]++
	c.N = d.calls[c.Queue+"."+c.Op]
	d.mu.Unlock()
	return d.on(c)
}

type hookQueue struct {
	gpu.Queue
	d    *hookDev
	name string
}

func (q *hookQueue) Read(dst []float32, src gpu.Tensor) error {
	if err := q.d.call(hookCall{Queue: q.name, Op: "Read", Len: len(dst)}); err != nil {
		return err
	}
	return q.Queue.Read(dst, src)
}

func (q *hookQueue) ReadInt(dst []int32, src gpu.Tensor) error {
	if err := q.d.call(hookCall{Queue: q.name, Op: "ReadInt", Len: len(dst)}); err != nil {
		return err
	}
	return q.Queue.ReadInt(dst, src)
}

func (q *hookQueue) Embed(dst, table gpu.Tensor, ids []int32) {
	q.d.call(hookCall{Queue: q.name, Op: "Embed", IDs: ids, Rows: dst.Rows})
	q.Queue.Embed(dst, table, ids)
}

// loadTinyHooked loads the tiny model on a CPU device wrapped by on, so
// that every stage's queue (the codec's included) is hooked.
func loadTinyHooked(t testing.TB, on func(hookCall) error) (*lfm2audio.Model, *hookDev) {
	t.Helper()
	cd := cpu.New(0)
	dev := newHookDev(cd, on)
	m, err := lfm2audio.Load(dev, tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); cd.Close() })
	return m, dev
}
