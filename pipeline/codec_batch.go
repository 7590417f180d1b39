package pipeline

import (
	"context"
	"time"

	"github.com/omni-pipe/omni-pipe/stages/family"
)

// codecRun is one turn's frames of a codec boundary, in order.
type codecRun struct {
	t    *turn
	msgs []codecMsg
}

// decodeRuns decodes the frames of pending (a turn's frames always come
// before its final message): each turn's frames in one call, and the
// turns' calls as one batch when the codec batches (family.BatchCodec) and
// more than one live turn has frames; otherwise one turn after another.
func (e *Engine) decodeRuns(pending []codecMsg) {
	var runs []codecRun
	at := map[*turn]int{}
	for _, msg := range pending {
		if msg.final || msg.stepEnd {
			continue
		}
		i, ok := at[msg.t]
		if !ok {
			i = len(runs)
			at[msg.t] = i
			runs = append(runs, codecRun{t: msg.t})
		}
		runs[i].msgs = append(runs[i].msgs, msg)
	}
	live := runs[:0]
	for _, r := range runs {
		if r.t.failed() == nil { // cancelled: no more audio
			live = append(live, r)
		}
	}
	if bc, ok := e.m.AudioCodec().(family.BatchCodec); ok && len(live) > 1 {
		if e.decodeBatchGuarded(bc, live) {
			return
		}
	}
	for _, r := range live {
		e.decodeGuarded(r.t, r.msgs)
	}
}

// decodeBatchGuarded is decodeBatch, a panic in which cancels every turn of
// the batch with a *StagePanic.
func (e *Engine) decodeBatchGuarded(bc family.BatchCodec, runs []codecRun) (done bool) {
	defer func() {
		if r := recover(); r != nil {
			p := e.stagePanic(StageCodec, r)
			for _, run := range runs {
				run.t.cancel(p)
			}
			done = true
		}
	}()
	return e.decodeBatch(bc, runs)
}

// decodeBatch decodes the runs' frames in one batched call and emits each
// turn's samples, exactly those of decoding its frames alone. It returns
// false, having decoded nothing, when the codec refuses the batch (the
// caller then decodes turn by turn, which reports the error to its turn).
func (e *Engine) decodeBatch(bc family.BatchCodec, runs []codecRun) bool {
	streams := make([]family.CodecStream, len(runs))
	codes := make([][][]int, len(runs))
	turns := make([]*turn, len(runs))
	rows := make([]int, len(runs))
	var steps []int
	for i, r := range runs {
		if r.t.codec == nil {
			r.t.codec = e.m.AudioCodec().NewStream()
		}
		streams[i], turns[i], rows[i] = r.t.codec, r.t, len(r.msgs)
		for _, m := range r.msgs {
			codes[i] = append(codes[i], m.frame)
			steps = append(steps, m.step)
		}
	}
	start := time.Now()
	// The turns' own contexts cannot end a shared call; a turn cancelled
	// meanwhile gets no more audio.
	pcm, err := bc.DecodeBatch(context.Background(), streams, codes)
	if err != nil {
		return false
	}
	e.recordRows(StageCodec, turns, steps, rows, start, "frames")
	for i, r := range runs {
		if r.t.failed() == nil {
			e.emitDecoded(r.t, r.msgs, pcm[i])
		}
	}
	return true
}

// stepOpen reports whether pending ends with frames of a depthformer step
// whose mark has not come yet.
func stepOpen(pending []codecMsg) bool {
	for i := len(pending) - 1; i >= 0; i-- {
		switch {
		case pending[i].stepEnd:
			return false
		case !pending[i].final:
			return true
		}
	}
	return false
}
