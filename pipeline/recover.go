package pipeline

import (
	"fmt"
	"runtime/debug"
)

// StagePanic is the error a turn ends with when a stage panicked while it
// held the turn (a bug, in omni-pipe, a device backend or a Teacher). The
// stage recovers: it fails the turns it held, logs the panic with its stack
// at error level, and goes on serving the others.
type StagePanic struct {
	Stage string // StageBackbone, StageDepth, …
	Value any    // what was passed to panic
	Stack []byte // the panicking goroutine's stack
}

func (p *StagePanic) Error() string {
	return fmt.Sprintf("internal error: the %s stage panicked: %v", p.Stage, p.Value)
}

// stagePanic builds and logs the error for a recovered panic value r. Call
// it from the deferred function that recovered, so that the stack is the
// panicking goroutine's.
func (e *Engine) stagePanic(stage string, r any) *StagePanic {
	p := &StagePanic{Stage: stage, Value: r, Stack: debug.Stack()}
	e.opts.Logger.Error("pipeline: stage panicked; its turns fail", "stage", stage, "panic", fmt.Sprint(r), "stack", string(p.Stack))
	return p
}

// runStep runs a batching stage's step on batch. If the step panics, every
// turn of the batch that it had not finished yet fails with a *StagePanic:
// a step hands its turns on only by finishing them or by returning them,
// so a turn it has not finished is still this stage's.
func (e *Engine) runStep(stage string, step func() (stay, pass []*turn), batch []*turn) (stay, pass []*turn) {
	defer func() {
		if r := recover(); r != nil {
			p := e.stagePanic(stage, r)
			for _, t := range batch {
				if !t.finished {
					e.finish(t, p)
				}
			}
			stay, pass = nil, nil
		}
	}()
	return step()
}

// guard runs a front-end stage's function on t; a panic cancels t with a
// *StagePanic, and t goes on to the backbone, which ends it.
func (e *Engine) guard(stage string, t *turn, f func(*turn) *turn) (out *turn) {
	defer func() {
		if r := recover(); r != nil {
			t.cancel(e.stagePanic(stage, r))
			out = t
		}
	}()
	return f(t)
}

// decodeGuarded is decode, a panic in which cancels t with a *StagePanic
// (the loop stages then end it, and its later frames are not decoded).
// flushGuarded is flushCodec with the same guard.
func (e *Engine) flushGuarded(t *turn) {
	defer func() {
		if r := recover(); r != nil {
			t.cancel(e.stagePanic(StageCodec, r))
		}
	}()
	e.flushCodec(t)
}

func (e *Engine) decodeGuarded(t *turn, msgs []codecMsg) {
	defer func() {
		if r := recover(); r != nil {
			t.cancel(e.stagePanic(StageCodec, r))
		}
	}()
	e.decode(t, msgs)
}
