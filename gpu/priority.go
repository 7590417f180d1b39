package gpu

// BackgroundQueuer is implemented by devices whose queues can be told
// apart by urgency: work on a background queue runs where the device has
// room once the other queues' work is placed (on CUDA, a stream of the
// lowest priority beside streams of the highest).
type BackgroundQueuer interface {
	NewBackgroundQueue(name string) Queue
}

// NewBackgroundQueue returns a queue for work the other queues should not
// wait behind — a codec that decodes a frame while the backbone computes
// the next one has a frame's time for it, the backbone step does not: d's
// background queue where it has them, else an ordinary one.
func NewBackgroundQueue(d Device, name string) Queue {
	if b, ok := d.(BackgroundQueuer); ok {
		return b.NewBackgroundQueue(name)
	}
	return d.NewQueue(name)
}
