package pipeline

import (
	"fmt"

	"github.com/reugn/go-streams"
)

// batchMap is a go-streams operator (a streams.Flow) that maps batches:
// it waits for the first element, then takes whatever else already waits
// on its inlet — never waiting for more, so an element alone goes on at
// once — up to limit elements and, when cost is set, up to budget in
// total cost (an element that would exceed it starts the next batch; one
// costlier than the budget goes alone). fn gets each batch and returns
// the elements to emit, which batchMap sends in the order fn gives them.
// One goroutine runs fn, so batches are processed in order.
//
// Its inlet is buffered with room for limit elements: what the upstream
// operator produces while fn runs waits there to join the next batch. When
// the inlet is closed, batchMap processes what is left and closes its
// outlet.
type batchMap[T any] struct {
	fn     func([]T) []T
	limit  int
	cost   func(T) int
	budget int
	in     chan any
	out    chan any
}

var _ streams.Flow = (*batchMap[any])(nil)

// newBatchMap returns a running batchMap. limit must be positive; cost may
// be nil (no budget).
func newBatchMap[T any](fn func([]T) []T, limit int, cost func(T) int, budget int) *batchMap[T] {
	if limit < 1 {
		panic(fmt.Sprintf("pipeline: batchMap limit %d", limit))
	}
	b := &batchMap[T]{fn: fn, limit: limit, cost: cost, budget: budget, in: make(chan any, limit), out: make(chan any)}
	go b.stream()
	return b
}

// In implements streams.Inlet.
func (b *batchMap[T]) In() chan<- any { return b.in }

// Out implements streams.Outlet.
func (b *batchMap[T]) Out() <-chan any { return b.out }

// Via streams the outlet to flow and returns it.
func (b *batchMap[T]) Via(flow streams.Flow) streams.Flow {
	go b.transmit(flow)
	return flow
}

// To streams the outlet to sink and blocks until the sink has completed.
func (b *batchMap[T]) To(sink streams.Sink) {
	b.transmit(sink)
	sink.AwaitCompletion()
}

func (b *batchMap[T]) transmit(inlet streams.Inlet) {
	for v := range b.out {
		inlet.In() <- v
	}
	close(inlet.In())
}

func (b *batchMap[T]) stream() {
	defer close(b.out)
	var (
		batch []T
		carry []T // an element that did not fit the last batch's budget
	)
	open := true
	for open || len(carry) > 0 {
		batch = append(batch[:0], carry...)
		carry = carry[:0]
		if len(batch) == 0 {
			v, ok := <-b.in
			if !ok {
				return
			}
			batch = append(batch, v.(T))
		}
		total := b.costOf(batch[0])
	take:
		for open && len(batch) < b.limit {
			select {
			case v, ok := <-b.in:
				if !ok {
					open = false
					break take
				}
				x := v.(T)
				c := b.costOf(x)
				if b.cost != nil && total+c > b.budget {
					carry = append(carry, x)
					break take
				}
				total += c
				batch = append(batch, x)
			default:
				break take
			}
		}
		for _, r := range b.fn(batch) {
			b.out <- r
		}
	}
}

func (b *batchMap[T]) costOf(x T) int {
	if b.cost == nil {
		return 0
	}
	return b.cost(x)
}
