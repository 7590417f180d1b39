package pipeline

import (
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// growableCache is a backbone cache that can be given the capacity of a
// whole turn at once (stages/lfm2's Cache): one allocation per turn instead
// of reallocations as it fills.
type growableCache interface {
	Grow(q gpu.Queue, positions int)
}

// preallocate gives t's cache room for every position the turn may reach:
// the history, the prompt and MaxNewTokens steps (what Start admitted).
func (e *Engine) preallocate(c *nn.Ctx, t *turn) {
	if g, ok := t.sess.cache.(growableCache); ok {
		g.Grow(c.Q, t.sess.chat.Len()+t.req.MaxNewTokens)
	}
}
