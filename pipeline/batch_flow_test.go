package pipeline

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/reugn/go-streams/extension"
)

// heldMap is a batchMap[int] whose function records its batches and, for
// the batches gate names, waits to be released.
type heldMap struct {
	b       *batchMap[int]
	mu      sync.Mutex
	batches [][]int
	entered chan int      // the number of each batch fn starts
	release chan struct{} // one receive per batch gate holds
}

func newHeldMap(limit int, cost func(int) int, budget int, gate func(n int) bool) *heldMap {
	h := &heldMap{entered: make(chan int, 100), release: make(chan struct{})}
	h.b = newBatchMap(func(xs []int) []int {
		h.mu.Lock()
		h.batches = append(h.batches, slices.Clone(xs))
		n := len(h.batches)
		h.mu.Unlock()
		h.entered <- n
		if gate(n) {
			<-h.release
		}
		return xs
	}, limit, cost, budget)
	return h
}

func (h *heldMap) got() [][]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.batches)
}

// waitBuffered waits until n elements wait on the inlet.
func (h *heldMap) waitBuffered(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(h.b.in) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d elements on the inlet, want %d", len(h.b.in), n)
		}
	}
}

// TestBatchMap: a lone element is mapped at once, without waiting for
// company; what arrives while a batch runs forms the next batch, up to the
// limit and the cost budget (an element over the budget starts the next
// batch; one over it by itself goes alone); elements leave in order;
// closing the inlet maps what is left, closes the outlet, and no goroutine
// stays behind.
func TestBatchMap(t *testing.T) {
	tests := []struct {
		name   string
		limit  int
		cost   func(int) int
		budget int
		first  int   // sent alone; its batch is held while rest queue
		rest   []int // queued while the first batch runs
		// held[i] is how many elements wait on the inlet before batch
		// i+1, held until then, is released.
		held []int
		want [][]int
	}{
		{"limit", 4, nil, 0, 1, []int{2, 3, 4, 5, 6, 7}, []int{4, 2}, [][]int{{1}, {2, 3, 4, 5}, {6, 7}}},
		{"one waiting", 4, nil, 0, 1, []int{2}, []int{1}, [][]int{{1}, {2}}},
		{"budget", 8, func(x int) int { return x }, 10, 1, []int{3, 4, 5, 20, 2, 6}, []int{6},
			[][]int{{1}, {3, 4}, {5}, {20}, {2, 6}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			h := newHeldMap(tt.limit, tt.cost, tt.budget, func(n int) bool { return n <= len(tt.held) })
			out := make(chan []int)
			go func() { out <- drainInts(h) }()
			h.b.In() <- tt.first
			select {
			case <-h.entered: // mapped alone, with nothing else sent
			case <-time.After(10 * time.Second):
				t.Fatal("a lone element waited")
			}
			go func() { // more than the inlet holds blocks: send from here
				for _, x := range tt.rest {
					h.b.In() <- x
				}
				close(h.b.In())
			}()
			for i, n := range tt.held {
				if i > 0 {
					<-h.entered // batch i+1 took its elements
				}
				h.waitBuffered(t, n)
				h.release <- struct{}{}
			}
			var got []int
			select {
			case got = <-out:
			case <-time.After(10 * time.Second):
				t.Fatal("the outlet did not close")
			}
			if want := append([]int{tt.first}, tt.rest...); !slices.Equal(got, want) {
				t.Errorf("out %v, want %v", got, want)
			}
			if b := h.got(); fmt.Sprint(b) != fmt.Sprint(tt.want) {
				t.Errorf("batches %v, want %v", b, tt.want)
			}
		})
	}
}

func drainInts(h *heldMap) []int {
	var out []int
	for v := range h.b.Out() {
		out = append(out, v.(int))
	}
	return out
}

// TestBatchMapInAFlow: as a go-streams Flow between a channel source and
// a Map, a batchMap passes every element on in order, and the flow's
// goroutines all return once the source closes.
func TestBatchMapInAFlow(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	src := make(chan any)
	h := newHeldMap(3, nil, 0, func(int) bool { return false })
	sink := extension.NewChanSink(make(chan any))
	go extension.NewChanSource(src).Via(h.b).To(sink)
	go func() {
		for i := range 20 {
			src <- i
		}
		close(src)
	}()
	var got []int
	for v := range sink.Out {
		got = append(got, v.(int))
	}
	if want := slices.Collect(func(yield func(int) bool) {
		for i := range 20 {
			if !yield(i) {
				return
			}
		}
	}); !slices.Equal(got, want) {
		t.Errorf("out %v, want %v", got, want)
	}
	for _, b := range h.got() {
		if len(b) > 3 {
			t.Errorf("batch %v exceeds the limit 3", b)
		}
	}
}
