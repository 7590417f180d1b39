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

// hookDev is a gpu.Device whose queues call on before every Read and
// Embed, on the goroutine that submits the op, and which calls it before
// every Free (queue "device"): a test acts inside a stage with it (fails a
// read as a GPU backend's can, panics, or blocks). What on returns for a
// Read is that Read's error (the op does not run); otherwise it is ignored.
// n counts that queue's calls of that op from 1; ids is the Embed's (nil
// for the others).
type hookDev struct {
	gpu.Device
	on func(queue, op string, n int, ids []int32) error

	mu    sync.Mutex
	calls map[string]int
}

func newHookDev(dev gpu.Device, on func(queue, op string, n int, ids []int32) error) *hookDev {
	return &hookDev{Device: dev, on: on, calls: map[string]int{}}
}

func (d *hookDev) NewQueue(name string) gpu.Queue {
	return &hookQueue{Queue: d.Device.NewQueue(name), d: d, name: name}
}

func (d *hookDev) Free(t gpu.Tensor) {
	d.call("device", "Free", nil)
	d.Device.Free(t)
}

func (d *hookDev) call(queue, op string, ids []int32) error {
	d.mu.Lock()
	d.calls[queue+"."+op]++
	n := d.calls[queue+"."+op]
	d.mu.Unlock()
	return d.on(queue, op, n, ids)
}

type hookQueue struct {
	gpu.Queue
	d    *hookDev
	name string
}

func (q *hookQueue) Read(dst []float32, src gpu.Tensor) error {
	if err := q.d.call(q.name, "Read", nil); err != nil {
		return err
	}
	return q.Queue.Read(dst, src)
}

func (q *hookQueue) Embed(dst, table gpu.Tensor, ids []int32) {
	q.d.call(q.name, "Embed", ids)
	q.Queue.Embed(dst, table, ids)
}

// loadTinyHooked loads the tiny model on a CPU device wrapped by on, so
// that every stage's queue (the codec's included) is hooked.
func loadTinyHooked(t testing.TB, on func(queue, op string, n int, ids []int32) error) (*lfm2audio.Model, *hookDev) {
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
