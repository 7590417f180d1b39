package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/reugn/go-streams/extension"
	"github.com/reugn/go-streams/flow"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/chat"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// frontend is the log-mel → encoder chain: a go-streams flow of a Map
// stage for the log-mel and a batchMap for the encoder (each one
// goroutine, which owns its queue; both keep turns in order). The encoder
// takes the turns whose clips wait for it when it is free (at most
// encodeBatchClips clips, encodeBatchFrames mel frames) and encodes them
// in one pass. Every element is a *turn; a cancelled turn passes through
// without work, so the flow never holds one back, and close drains it so
// that every go-streams goroutine returns.
type frontend struct {
	e    *Engine
	src  chan any
	enc  *batchMap[*turn]
	done chan struct{}
	once sync.Once
	// dev is the front end's device half where the encoder's queue can
	// compute the features (gpu.LogMeler) and the front end offers it:
	// the log-mel stage then only checks and pre-emphasises each clip.
	dev family.DeviceFrontend
}

// The encoder's batch limits: clips, and mel frames in all (24,000 frames
// are 4 minutes of audio at 100 frames a second). A clip longer than the
// frame budget is encoded alone.
const (
	encodeBatchClips  = 32
	encodeBatchFrames = 24000
)

func newFrontend(e *Engine) *frontend {
	f := &frontend{e: e, src: make(chan any, e.opts.MaxTurns), done: make(chan struct{})}
	encQ := e.dev.NewQueue(StageEncoder)
	encCtx := nn.NewCtx(e.dev, encQ, e.opts.Precision)
	if df, ok := e.m.Frontend().(family.DeviceFrontend); ok && !e.opts.HostLogMel {
		if _, ok := encQ.(gpu.LogMeler); ok {
			f.dev = df
		}
	}
	mel := flow.NewMap(func(t *turn) *turn { return e.guard(StageFrontend, t, f.mel) }, 1)
	f.enc = newBatchMap(func(ts []*turn) []*turn { return f.encode(encCtx, ts) },
		encodeBatchClips, melFrames, encodeBatchFrames)
	extension.NewChanSource(f.src).Via(mel).Via(f.enc)
	go func() {
		defer close(f.done)
		for v := range f.enc.Out() {
			e.bbIn <- v.(*turn)
		}
	}()
	return f
}

// melFrames is a turn's cost in the encoder's batch: its clip's mel frames
// (none once it failed before its features).
func melFrames(t *turn) int {
	if t.mel == nil {
		return 0
	}
	return t.mel.Frames
}

func (f *frontend) submit(t *turn) { f.src <- t }

// close stops the flow once every submitted turn has left it.
func (f *frontend) close() {
	f.once.Do(func() { close(f.src) })
	<-f.done
}

// mel computes the clip's log-mel features (resampling to the front end's
// rate first).
func (f *frontend) mel(t *turn) *turn {
	if t.failed() != nil {
		return t
	}
	start := time.Now()
	m, rec := f.e.m.Frontend(), t.req.Record
	clip := t.req.Audio
	x := clip.Samples
	if rec != nil {
		rec.SetFloats("input_wav", x, 1, len(x))
		rec.SetInts("input_sample_rate", []int{clip.SampleRate}, 1)
	}
	if clip.SampleRate != m.SampleRate() {
		r, err := audio.CachedResampler(clip.SampleRate, m.SampleRate())
		if err != nil {
			t.cancel(fmt.Errorf("resample: %w", err))
			return t
		}
		x = r.Resample(x)
		if rec != nil {
			rec.SetFloats("wav_16k", x, 1, len(x))
		}
	}
	if f.dev != nil && rec == nil {
		in, err := f.dev.PrepareDevice(x)
		if err == nil && in != nil && in.Frames != t.clip.MelFrames {
			err = fmt.Errorf("log-mel gave %d frames, expected %d", in.Frames, t.clip.MelFrames)
		}
		if err != nil {
			t.cancel(fmt.Errorf("log-mel: %w", err))
			return t
		}
		if in != nil { // the encoder's queue computes the features
			t.mel, t.melIn = &audio.Features{Frames: in.Frames, Valid: in.Valid, Bins: in.Bins}, in
			f.e.record(StageFrontend, []*turn{t}, nil, start, "clip")
			return t
		}
	}
	feats, err := m.Features(x)
	if err == nil && feats.Frames != t.clip.MelFrames {
		err = fmt.Errorf("log-mel gave %d frames, expected %d", feats.Frames, t.clip.MelFrames)
	}
	if err != nil {
		t.cancel(fmt.Errorf("log-mel: %w", err))
		return t
	}
	if rec != nil {
		rec.SetFloats("mel_f32", transpose(feats.Data, feats.Frames, feats.Bins), feats.Bins, feats.Frames)
	}
	if f.e.opts.Precision == nn.BF16 {
		feats.RoundBF16() // ChatState feeds the encoder bf16 features
	}
	if rec != nil {
		rec.SetFloats("mel", transpose(feats.Data, feats.Frames, feats.Bins), feats.Bins, feats.Frames)
		rec.SetInts("prompt_audio_in_lens", []int{feats.Frames}, 1)
	}
	t.mel = feats
	f.e.record(StageFrontend, []*turn{t}, nil, start, "clip")
	return t
}

// transpose returns the [cols, rows] transpose of a [rows, cols] matrix.
func transpose(v []float32, rows, cols int) []float32 {
	out := make([]float32, len(v))
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			out[c*rows+r] = v[r*cols+c]
		}
	}
	return out
}

// encode runs the conformer and the adapter over the clips of ts, one
// batch (family.BatchFrontend; one by one where the front end does not
// batch); each clip's rows land in its turn, and ts go on in order. Failed
// and cancelled turns pass through untouched. A clip that fails fails only
// its own turn: when a batch fails as a whole (a panic or a device error),
// each of its clips is encoded again alone.
func (f *frontend) encode(c *nn.Ctx, ts []*turn) []*turn {
	var live []*turn
	for _, t := range ts {
		if t.failed() == nil && t.mel != nil {
			live = append(live, t)
		}
	}
	bf, batches := f.e.m.Frontend().(family.BatchFrontend)
	if batches && len(live) > 1 {
		err := f.tryBatch(c, bf, live)
		if err == nil {
			return ts
		}
		f.e.opts.Logger.Warn("pipeline: a batch of clips failed in the encoder; encoding them one by one", "clips", len(live), "err", err)
	}
	for _, t := range live {
		f.e.guard(StageEncoder, t, func(t *turn) *turn {
			f.encodeOne(c, t)
			return t
		})
	}
	return ts
}

// encodeOne encodes t's clip alone; a failure cancels t.
func (f *frontend) encodeOne(c *nn.Ctx, t *turn) {
	start := time.Now()
	c.A.Reset()
	mel := c.Tmp(t.mel.Frames, t.mel.Bins)
	f.features(c, mel, t)
	enc := f.e.m.Frontend().Encode(c, mel)
	if err := f.land(c, []*turn{t}, enc, []int{enc.Rows}); err != nil {
		t.cancel(fmt.Errorf("encoder: %w", err))
		return
	}
	f.e.record(StageEncoder, []*turn{t}, nil, start, "clip")
}

// tryBatch is encodeBatch with a panic returned as its *StagePanic (and
// logged): the caller encodes the clips again one by one.
func (f *frontend) tryBatch(c *nn.Ctx, bf family.BatchFrontend, ts []*turn) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = f.e.stagePanic(StageEncoder, r)
		}
	}()
	return f.encodeBatch(c, bf, ts)
}

// encodeBatch encodes the clips of ts in one pass: their features written
// in one transfer, one EncodeBatch, one Adapt and one read of all rows. A
// device error is returned with no turn touched.
func (f *frontend) encodeBatch(c *nn.Ctx, bf family.BatchFrontend, ts []*turn) error {
	start := time.Now()
	c.A.Reset()
	frames := make([]int, len(ts))
	total := 0
	for i, t := range ts {
		frames[i] = t.mel.Frames
		total += t.mel.Frames
	}
	mel := c.Tmp(total, ts[0].mel.Bins)
	r0 := 0
	for _, t := range ts {
		f.features(c, mel.Slice(r0, r0+t.mel.Frames), t)
		r0 += t.mel.Frames
	}
	enc, rows := bf.EncodeBatch(c, mel, frames)
	if err := f.land(c, ts, enc, rows); err != nil {
		return err
	}
	f.e.recordRows(StageEncoder, ts, nil, frames, start, "clips")
	return nil
}

// land runs the adapter on the encoder rows enc of the clips of ts
// (rows[i] rows for ts[i], one clip after another), reads the result in
// one transfer and gives every turn its clip's rows, recording
// encoder_out and adapter_out for the turns that record. A clip with the
// wrong number of rows cancels its own turn; a failed read is returned
// before any turn is touched.
func (f *frontend) land(c *nn.Ctx, ts []*turn, enc gpu.Tensor, rows []int) error {
	encOut := make([][]float32, len(ts))
	r0 := 0
	for i, t := range ts {
		if t.req.Record != nil {
			x := enc.Slice(r0, r0+rows[i])
			encOut[i] = make([]float32, x.Len())
			if err := c.Q.Read(encOut[i], x); err != nil {
				return err
			}
		}
		r0 += rows[i]
	}
	out := f.e.m.Frontend().Adapt(c, enc)
	host := make([]float32, out.Len())
	if err := c.Q.Read(host, out); err != nil {
		return err
	}
	r0 = 0
	for i, t := range ts {
		n := rows[i]
		feats := slices.Clone(host[r0*out.Cols : (r0+n)*out.Cols])
		r0 += n
		if want := chat.Rows(t.clip.MelFrames); n != want {
			t.cancel(fmt.Errorf("encoder gave %d rows for %d mel frames", n, t.clip.MelFrames))
			continue
		}
		if rec := t.req.Record; rec != nil {
			rec.SetFloats("encoder_out", encOut[i], n, enc.Cols)
			rec.SetFloats("adapter_out", feats, n, out.Cols)
		}
		t.clip.Features = feats
		t.mel, t.melIn = nil, nil
	}
	return nil
}

// features puts t's log-mel features into dst [t.mel.Frames, bins]: the
// host's (a write) or, for a clip prepared for the device, computed there.
func (f *frontend) features(c *nn.Ctx, dst gpu.Tensor, t *turn) {
	if t.melIn != nil {
		f.dev.FeaturesOn(c.Q, dst, c.Tmp(1, len(t.melIn.Samples)), t.melIn)
		return
	}
	c.Q.Write(dst, t.mel.Data)
}

// gather blocks for the first pending turn of in (or returns nil when the
// engine stops), then takes whatever else is pending, up to limit.
func (e *Engine) gather(in chan *turn, batch []*turn, limit int) []*turn {
	if len(batch) == 0 {
		select {
		case t := <-in:
			batch = append(batch, t)
		case <-e.stop:
			return nil
		}
	}
	for len(batch) < limit {
		select {
		case t := <-in:
			batch = append(batch, t)
		default:
			return batch
		}
	}
	return batch
}

// actor runs a batching stage: at each step it takes every turn pending
// on in into its queue, serves up to MaxBatch of them in nextBatch's
// order (the turns that have not spoken yet, then those it served least
// recently, new turns before all others), and computes them as
// one batch with step, whose results are the turns that stay in this stage
// for another round and those that go on to out. A turn the step does not
// return it has finished. Turns join and leave only between steps. It
// returns when the engine stops.
func (e *Engine) actor(name string, slot int, in, out chan *turn, step func(*nn.Ctx, []*turn) (stay, pass []*turn)) {
	defer e.wg.Done()
	c := nn.NewCtx(e.dev, e.dev.NewQueue(name), e.opts.Precision)
	var queue []*turn
	var round uint64
	for {
		queue = e.gather(in, queue, math.MaxInt)
		if queue == nil {
			return
		}
		round++
		var batch []*turn
		batch, queue = nextBatch(queue, slot, e.opts.MaxBatch, round)
		stay, pass := e.runStep(name, func() ([]*turn, []*turn) { return step(c, batch) }, batch)
		queue = append(queue, stay...)
		for _, t := range pass {
			out <- t
		}
	}
}

// nextBatch takes from queue the round's batch: up to limit turns, the
// newcomers first, then those the stage served least recently (in queue
// order among equals), stamped with round; the rest keep their order.
func nextBatch(queue []*turn, slot, limit int, round uint64) (batch, rest []*turn) {
	slices.SortStableFunc(queue, func(a, b *turn) int {
		return cmp.Or(cmp.Compare(a.rank(), b.rank()), cmp.Compare(a.served[slot], b.served[slot]))
	})
	n := min(len(queue), limit)
	batch = slices.Clone(queue[:n])
	for _, t := range batch {
		t.served[slot] = round
	}
	return batch, slices.Delete(queue, 0, n)
}

// newcomerSteps is the most steps a turn is a newcomer for when it does
// not speak (a text-only reply, a sequential reply's text).
const newcomerSteps = 16

// rank orders turns for a batch: 0 for a newcomer (a turn that has not
// sampled an audio frame yet, in its first newcomerSteps steps), 1 for the
// others. With more turns than a batch holds the newcomers go first, so a
// new question's first audio waits for its own steps, not for rounds of
// every session; a newcomer stops being one within a few steps, so the
// others wait at most that long.
func (t *turn) rank() int {
	if t.audioN == 0 && t.sm.Steps() <= newcomerSteps {
		return 0
	}
	return 1
}

// backboneStep serves every turn whose next input is ready (prompts and
// fed-back tokens or frames) in one batched forward pass, samples text
// where the step is a text step, and passes audio steps on to the
// depthformer; the turns whose next step is a text step again stay. The
// prompts' rows of one step are at most PrefillChunk, handed out in batch
// order: a prompt with rows left (or none given this step) stays, and
// samples once its last chunk is in.
func (e *Engine) backboneStep(c *nn.Ctx, batch []*turn) (next, audio []*turn) {
	lm := e.m.LM()
	H := e.info.HiddenSize
	live := batch[:0:0]
	var rows []int
	var waiting []*turn // prompts given no rows this step
	budget := e.opts.PrefillChunk
	for _, t := range batch {
		if err := t.failed(); err != nil {
			e.finish(t, err)
			continue
		}
		n := 1
		if t.input == inPrompt {
			n = min(t.sess.chat.Len()-t.sess.fed, budget)
			if n <= 0 { // this step's prefill rows are taken: wait for the next
				waiting = append(waiting, t)
				continue
			}
			budget -= n
		}
		if t.sess.cache == nil {
			t.sess.cache = lm.NewCache(e.dev)
		}
		if t.input == inPrompt && t.prefilled == 0 {
			e.preallocate(c, t)
		}
		live = append(live, t)
		rows = append(rows, n)
	}
	if len(live) == 0 {
		return waiting, nil
	}
	start := time.Now()
	c.A.Reset()
	seqs := make([]family.Seq, len(live))
	total := 0
	for i, t := range live {
		seqs[i] = family.Seq{Cache: t.sess.cache, Rows: rows[i]}
		total += rows[i]
	}
	x := c.Tmp(total, H)
	e.embedInputs(c, x, live, rows)
	h := lm.Forward(c, x, seqs)

	// Gather the last row of each turn: text turns get logits, audio turns
	// hand the row to the depthformer; a prompt with rows left samples
	// nothing yet.
	var texts, audios, partial, prefilled []int
	r0 := 0
	lasts := make([]int, len(live))
	for i, t := range live {
		r0 += seqs[i].Rows
		lasts[i] = r0 - 1
		t.sess.fed += seqs[i].Rows
		switch {
		case t.input == inPrompt && t.sess.fed < t.sess.chat.Len():
			partial = append(partial, i)
		case t.req.prefill: // Engine.Prefill's: computed, nothing to sample
			prefilled = append(prefilled, i)
		case t.kind == TextStep:
			texts = append(texts, i)
		default:
			audios = append(audios, i)
		}
	}
	// A failed read fails its turns. The error stays in this goroutine (the
	// codec may be looking at the same turns) until finish hands it on.
	errs := make([]error, len(live))
	var picks []int
	var logits [][]float32
	if len(texts) > 0 {
		hs := c.Tmp(len(texts), H)
		gpu.CopyRows(c.Q, hs, h, iota32(len(texts)), toInt32(pickAt(lasts, texts)))
		lg := c.Tmp(len(texts), e.info.VocabSize)
		lm.Logits(c, lg, hs)
		var terrs []error
		picks, logits, terrs = sampleText(c, lg, pickAt(live, texts))
		for j, i := range texts {
			errs[i] = terrs[j]
		}
	}
	// The rows the depthformer (or a recording) needs, gathered on the
	// device and read in one transfer.
	var need []int
	for i, t := range live {
		if done := t.input != inPrompt || t.sess.fed == t.sess.chat.Len(); done && (t.kind == AudioStep || t.req.Record != nil) {
			need = append(need, i)
		}
	}
	if len(need) > 0 {
		hn := c.Tmp(len(need), H)
		gpu.CopyRows(c.Q, hn, h, iota32(len(need)), toInt32(pickAt(lasts, need)))
		all := make([]float32, len(need)*H)
		err := c.Q.Read(all, hn)
		for j, i := range need {
			live[i].hidden = all[j*H : (j+1)*H : (j+1)*H]
			if err != nil {
				errs[i] = cmp.Or(errs[i], fmt.Errorf("backbone: read hidden state: %w", err))
			}
		}
	}
	for i, t := range live {
		done := t.input != inPrompt || t.sess.fed == t.sess.chat.Len()
		if t.input == inPrompt {
			n := seqs[i].Rows
			t.prefilled += n
			if t.req.Record != nil {
				v := make([]float32, n*H)
				if err := c.Q.Read(v, h.Slice(lasts[i]+1-n, lasts[i]+1)); err != nil {
					errs[i] = cmp.Or(errs[i], fmt.Errorf("backbone: read prompt states: %w", err))
				} else {
					t.promptH = append(t.promptH, v...)
					if done {
						e.recordPrompt(t, t.promptH, t.prefilled)
						t.promptH = nil
					}
				}
			}
			if done {
				t.tm.Prefill = time.Since(t.start)
				t.tm.PromptRows = t.prefilled
			}
		}
	}
	e.recordRows(StageBackbone, live, stepsOf(live), rows, start, "step")
	for _, i := range partial {
		if errs[i] != nil {
			e.finish(live[i], errs[i])
			continue
		}
		next = append(next, live[i])
	}
	for _, i := range prefilled {
		e.finish(live[i], errs[i])
	}
	next = append(next, waiting...) // after the partial prompts: first come, first prefilled
	for j, i := range texts {
		t := live[i]
		if errs[i] != nil {
			e.finish(t, errs[i])
			continue
		}
		if e.onText(t, picks[j], logits[j]) {
			next = append(next, t)
		}
	}
	for _, i := range audios {
		t := live[i]
		if errs[i] != nil {
			e.finish(t, errs[i])
			continue
		}
		audio = append(audio, t)
	}
	return next, audio
}

// recordPrompt records the prompt's rows as ChatState holds them and the
// backbone's output for every one.
func (e *Engine) recordPrompt(t *turn, hidden []float32, n int) {
	rec, ch := t.req.Record, t.sess.chat
	rec.SetFloats("prefill_hidden", hidden, n, len(hidden)/n)
	ids := ch.TextIDs()
	rec.SetInts("prompt_text_ids", ids, len(ids))
	mods := ch.Modalities()
	mi := make([]int, len(mods))
	for i, m := range mods {
		mi[i] = int(m)
	}
	rec.SetInts("prompt_modality", mi, len(mi))
	frames := ch.AudioOut()
	cb := e.info.Codebooks
	out := make([]int, cb*len(frames))
	for f, codes := range frames {
		for c, v := range codes {
			out[c*len(frames)+f] = v
		}
	}
	rec.SetInts("prompt_audio_out", out, cb, len(frames))
}

// embedInputs writes every turn's input rows of a backbone step into x
// (rows[i] rows for live[i], in order): prompts as their chat rows, and all
// sampled tokens and all sampled frames each in one op, however many
// sessions the step holds.
func (e *Engine) embedInputs(c *nn.Ctx, x gpu.Tensor, live []*turn, rows []int) {
	var tokRows, frameRows []int32
	var toks []int32
	var frames [][]int
	r0 := 0
	for i, t := range live {
		switch t.input {
		case inPrompt:
			e.embedRows(c, x.Slice(r0, r0+rows[i]), t.sess.chat.Rows(t.sess.fed, t.sess.fed+rows[i]))
		case inToken:
			tokRows, toks = append(tokRows, int32(r0)), append(toks, int32(t.token))
		case inFrame:
			frameRows, frames = append(frameRows, int32(r0)), append(frames, t.frame)
		}
		r0 += rows[i]
	}
	if len(toks) > 0 {
		dst, scatter := scratchFor(c, x, tokRows)
		e.m.LM().EmbedTokens(c, dst, toks)
		scatter()
	}
	if len(frames) > 0 {
		dst, scatter := scratchFor(c, x, frameRows)
		e.m.Head().EmbedFrames(c, dst, frames)
		scatter()
	}
}

// scratchFor returns where to write rows that belong at rows of x: x's own
// rows when they are consecutive, else a scratch tensor, with the op that
// copies it into place (one CopyRows).
func scratchFor(c *nn.Ctx, x gpu.Tensor, rows []int32) (gpu.Tensor, func()) {
	consecutive := true
	for j := range rows {
		consecutive = consecutive && rows[j] == rows[0]+int32(j)
	}
	if consecutive {
		return x.Slice(int(rows[0]), int(rows[0])+len(rows)), func() {}
	}
	tmp := c.Tmp(len(rows), x.Cols)
	return tmp, func() { gpu.CopyRows(c.Q, x, tmp, rows, iota32(len(rows))) }
}

// iota32 returns 0, 1, …, n−1.
func iota32(n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

// embedRows writes the embeddings of chat rows into x (one row each), as
// liquid-audio's _prefill assembles them.
func (e *Engine) embedRows(c *nn.Ctx, x gpu.Tensor, rows []chat.Row) {
	H := x.Cols
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].Mod == rows[i].Mod && (rows[i].Mod != chat.AudioIn || rows[j].Clip == rows[i].Clip) {
			j++
		}
		dst := x.Slice(i, j)
		switch rows[i].Mod {
		case chat.Text:
			ids := make([]int32, j-i)
			for k := range ids {
				ids[k] = int32(rows[i+k].Token)
			}
			e.m.LM().EmbedTokens(c, dst, ids)
		case chat.AudioIn:
			feats := rows[i].Clip.Features.([]float32)
			a, b := rows[i].Index, rows[j-1].Index+1
			c.Q.Write(dst, feats[a*H:b*H])
		case chat.AudioOut:
			frames := make([][]int, j-i)
			for k := range frames {
				frames[k] = rows[i+k].Codes
			}
			e.m.Head().EmbedFrames(c, dst, frames)
		}
		i = j
	}
}

// sampleText picks the next token of every text turn ts[j] from its
// logits row j of lg [len(ts), V], all on the device in one Sample (row j
// made by ts[j]'s sampler, which draws as Sampler.Pick would), and reads
// back only the picks: one id a turn, in one read. The full rows come back
// (gathered into one read) only for the turns that use them on the host,
// those with a Teacher or a recording: logits[j] is nil for the others.
// errs[j] is what failed ts[j]: a failed read fails the turns it was for.
func sampleText(c *nn.Ctx, lg gpu.Tensor, ts []*turn) (picks []int, logits [][]float32, errs []error) {
	n, V := lg.Rows, lg.Cols
	rows := make([]gpu.SampleRow, n)
	var host []int
	for j, t := range ts {
		rows[j] = t.textS.Row(t.textH)
		if t.req.Teacher != nil || t.req.Record != nil {
			host = append(host, j)
		}
	}
	// The host's rows are gathered before Sample runs, so that they are the
	// logits as Logits left them whatever a backend's Sample does with its
	// input.
	hl := lg
	if len(host) > 0 && len(host) < n {
		hl = c.Tmp(len(host), V)
		gpu.CopyRows(c.Q, hl, lg, iota32(len(host)), toInt32(host))
	}
	ids := c.A.GetI32(n, 1)
	c.Q.Sample(ids, lg, rows)
	picks, logits, errs = make([]int, n), make([][]float32, n), make([]error, n)
	got := make([]int32, n)
	if err := c.Q.ReadInt(got, ids); err != nil {
		for j := range errs {
			errs[j] = fmt.Errorf("backbone: read text picks: %w", err)
		}
		return picks, logits, errs
	}
	for j, id := range got {
		picks[j] = int(id)
		if id < 0 || int(id) >= V {
			errs[j] = fmt.Errorf("backbone: the device picked token %d of %d", id, V)
		}
	}
	if len(host) == 0 {
		return picks, logits, errs
	}
	all := make([]float32, len(host)*V)
	err := c.Q.Read(all, hl.Slice(0, len(host)))
	for k, j := range host {
		logits[j] = all[k*V : (k+1)*V : (k+1)*V]
		if err != nil {
			errs[j] = cmp.Or(errs[j], fmt.Errorf("backbone: read logits: %w", err))
		}
	}
	return picks, logits, errs
}

// pickAt returns v[idx[0]], v[idx[1]], ….
func pickAt[T any](v []T, idx []int) []T {
	out := make([]T, len(idx))
	for j, i := range idx {
		out[j] = v[i]
	}
	return out
}

// toInt32 returns v as int32s.
func toInt32(v []int) []int32 {
	s := make([]int32, len(v))
	for j, x := range v {
		s[j] = int32(x)
	}
	return s
}

// onText takes a text step's pick (the turn's sampler's, made on the
// device) and reports whether the turn continues with another backbone
// step. logits are the step's logits when the turn has a Teacher or a
// recording (which use them), else nil.
func (e *Engine) onText(t *turn, pick int, logits []float32) bool {
	step := t.sm.Steps() - 1
	own := pick
	if t.req.Teacher != nil {
		pick = t.req.Teacher.Text(step, pick, logits)
	}
	o := t.sm.OnText(pick)
	t.tm.Steps++
	if rec := t.req.Record; rec != nil {
		if t.input == inPrompt {
			rec.SetFloats("prefill_text_logits", logits, len(logits))
		}
		rec.textStep(t.hidden, logits, own, o.Emit)
	}
	if o.Emit {
		t.sess.chat.AppendToken(pick)
		t.textH = append(t.textH, pick)
		t.tm.Tokens++
		if !e.m.Tokenizer().IsSpecial(pick) {
			if d := t.dec.Add(pick); d != "" {
				t.text.WriteString(d)
				if t.tm.FirstText == 0 {
					t.tm.FirstText = time.Since(t.start)
				}
				t.emit(&TextEvent{Delta: d, Token: pick})
			}
		}
	}
	if o.Stop {
		e.finish(t, nil)
		return false
	}
	t.input, t.token = inToken, pick
	return e.advance(t)
}

// advance starts the turn's next step, or finishes it at max_new_tokens.
func (e *Engine) advance(t *turn) bool {
	k, ok := t.sm.Step()
	if !ok {
		e.finish(t, nil)
		return false
	}
	t.kind = k
	return true
}

// depthStep samples an audio frame for every turn whose backbone row is
// ready, in one batched depthformer pass, and passes each turn back to the
// backbone (and its frame to the codec).
func (e *Engine) depthStep(c *nn.Ctx, batch []*turn) (_, back []*turn) {
	live := batch[:0:0]
	for _, t := range batch {
		if err := t.failed(); err != nil {
			e.finish(t, err)
			continue
		}
		live = append(live, t)
	}
	if len(live) == 0 {
		return nil, nil
	}
	// The step's frames reach the codec at one boundary: the mark after
	// them tells the codec that the frames of this step are all sent (even
	// when the step breaks down), so that it decodes them together.
	sent := false
	defer func() {
		if sent {
			e.codecIn <- codecMsg{stepEnd: true}
		}
	}()
	start := time.Now()
	c.A.Reset()
	H := e.info.HiddenSize
	h := c.Tmp(len(live), H)
	hv := make([]float32, 0, len(live)*H)
	for _, t := range live {
		hv = append(hv, t.hidden...)
	}
	c.Q.Write(h, hv)
	CB := e.info.Codebooks
	own := make([][]int, len(live))
	logs := make([][][]float32, len(live))
	for r := range live {
		own[r] = make([]int, CB)
		if live[r].req.Record != nil {
			logs[r] = make([][]float32, CB)
		}
	}
	var codes [][]int
	var err error
	if sh, ok := e.m.Head().(family.SampledHead); ok && !hostPicks(live) {
		// Every pick on the device: the frame returns only its codes.
		codes, err = sh.FrameSampled(c, h, sampleRows(live, CB))
		for r := range codes {
			copy(own[r], codes[r])
		}
	} else {
		codes, err = e.m.Head().Frame(c, h, func(r, i int, logits []float32) int {
			t := live[r]
			pick := t.audioS.Pick(logits, t.audioH[i])
			own[r][i] = pick
			if logs[r] != nil {
				logs[r][i] = slices.Clone(logits)
			}
			if t.req.Teacher != nil {
				pick = t.req.Teacher.AudioCode(t.sm.Steps()-1, i, pick, logits)
			}
			return pick
		})
	}
	e.record(StageDepth, live, stepsOf(live), start, "frame")
	for r, t := range live {
		if err != nil {
			e.finish(t, fmt.Errorf("depthformer: %w", err))
			continue
		}
		frame := codes[r]
		if rec := t.req.Record; rec != nil {
			rec.audioStep(t.hidden, own[r], logs[r])
		}
		audioStep := t.audioN
		t.audioN++
		t.sm.OnAudio(frame) // forces an end-of-audio frame to all end-of-audio
		t.tm.Steps++
		t.tm.Frames++
		t.sess.chat.AppendFrame(frame)
		for i, code := range frame {
			t.audioH[i] = append(t.audioH[i], code)
		}
		// The codec decodes its codes only: a frame holding the end-of-audio
		// code anywhere is not decoded (as demo/chat.py skips it).
		if !slices.Contains(frame, e.info.Special.EOA) {
			e.codecIn <- codecMsg{t: t, frame: slices.Clone(frame), audioStep: audioStep, step: t.sm.Steps() - 1}
			sent = true
		}
		t.input, t.frame = inFrame, frame
		if e.advance(t) {
			back = append(back, t)
		}
	}
	return nil, back
}

// codecMsg is a frame to decode for t, or (final) the end of t, or
// (stepEnd, t nil) the mark after the frames of a depthformer step.
type codecMsg struct {
	t         *turn
	frame     []int
	audioStep int // the frame's index among the turn's audio steps
	step      int // the backbone step that sampled it
	final     bool
	err       error
	stepEnd   bool
}

// finish ends t after its last frame has been decoded: the codec stage
// emits the terminal event. err is nil for a turn that ended normally.
func (e *Engine) finish(t *turn, err error) {
	if t.finished {
		panic("pipeline: turn finished twice")
	}
	t.finished = true
	e.codecIn <- codecMsg{t: t, final: true, err: err}
}

// codecLoop decodes frames to PCM as they come, one stream per turn, and
// ends turns in order after their last frame.
func (e *Engine) codecLoop() {
	defer e.wg.Done()
	_, batches := e.m.AudioCodec().(family.BatchCodec)
	var pending []codecMsg
	for {
		select {
		case msg := <-e.codecIn:
			pending = append(pending[:0], msg)
		case <-e.stop:
			return
		}
	drain:
		for len(pending) < 64 {
			select {
			case msg := <-e.codecIn:
				pending = append(pending, msg)
			default:
				break drain
			}
		}
		// A codec that batches waits for the rest of a depthformer step's
		// frames (the step is host work away from its mark), so that the
		// turns of the step decode together.
		for batches && stepOpen(pending) {
			select {
			case msg := <-e.codecIn:
				pending = append(pending, msg)
			case <-e.stop:
				return
			}
		}
		// Decode each turn's frames in one call (a chunk decodes to exactly
		// the samples of frame-by-frame decoding), the turns together when
		// the codec batches; then end the turns whose last frame came.
		e.decodeRuns(pending)
		for _, msg := range pending {
			if msg.final {
				if msg.err == nil {
					e.flushGuarded(msg.t)
				}
				e.complete(msg.t, msg.err)
			}
		}
	}
}

func (e *Engine) decode(t *turn, msgs []codecMsg) {
	if t.failed() != nil {
		return // cancelled: no more audio
	}
	frames := make([][]int, len(msgs))
	for k, m := range msgs {
		frames[k] = m.frame
	}
	start := time.Now()
	if t.codec == nil {
		t.codec = e.m.AudioCodec().NewStream()
	}
	pcm, err := t.codec.DecodeFrames(t.ctx, frames)
	steps := make([]int, len(msgs))
	for k, m := range msgs {
		steps[k] = m.step
	}
	e.recordRows(StageCodec, []*turn{t}, steps, []int{len(msgs)}, start, "frames")
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			t.cancel(fmt.Errorf("codec: %w", err))
		}
		return
	}
	e.emitDecoded(t, msgs, pcm)
}

// emitDecoded emits the samples pcm that t's codec stream decoded from
// the frames of msgs.
func (e *Engine) emitDecoded(t *turn, msgs []codecMsg, pcm []float32) {
	n := e.m.AudioCodec().FrameSamples()
	// A codec that lags (the detokenizer's overlap-add) returns Lag()
	// fewer samples for the turn's first call; frame k's samples then end
	// at (k+1)·n − Lag() and the rest come with the stream's Flush.
	lag := 0
	if t.codecN == 0 {
		lag = e.m.AudioCodec().Lag()
	}
	t.codecN += len(msgs)
	for k := range msgs {
		lo, hi := max(0, k*n-lag), min(len(pcm), (k+1)*n-lag)
		if hi < lo {
			hi = lo
		}
		if lo > len(pcm) {
			break
		}
		if rec := t.req.Record; rec != nil {
			rec.decoded(msgs[k].audioStep, msgs[k].frame, pcm[lo:hi])
		}
		e.emitAudio(t, pcm[lo:hi:hi])
	}
}

// emitAudio sends a piece of t's speech (none when empty).
func (e *Engine) emitAudio(t *turn, pcm []float32) {
	if len(pcm) == 0 {
		return
	}
	rate := e.m.AudioCodec().SampleRate()
	if t.tm.FirstAudio == 0 {
		t.tm.FirstAudio = time.Since(t.start)
	}
	t.tm.AudioSeconds += float64(len(pcm)) / float64(rate)
	t.emit(&AudioEvent{Seq: t.seq, Samples: pcm, Rate: rate})
	t.seq++
}

// flushCodec emits the samples t's codec stream holds back at the end of
// a turn that was not cancelled (none for Mimi).
func (e *Engine) flushCodec(t *turn) {
	if t.codec == nil || t.failed() != nil {
		return
	}
	pcm := t.codec.Flush()
	if rec := t.req.Record; rec != nil {
		rec.flushed(pcm)
	}
	e.emitAudio(t, pcm[:len(pcm):len(pcm)])
}

// complete ends t: history, timings, the terminal event, and the release
// of its session and slot. Whatever happens while it settles the turn, the
// slot, the session and the stream are released.
func (e *Engine) complete(t *turn, err error) {
	var last Event
	func() {
		defer func() {
			if r := recover(); r != nil {
				p := e.stagePanic(StageCodec, r)
				forgetBroken(t)
				last = &ErrorEvent{Err: p, Timings: t.timings()}
			}
		}()
		last = e.settle(t, err)
	}()
	t.stopWatch()
	t.cancelF(nil)
	e.settleMemory(t)
	// Free the slot and the session before the client learns the turn is
	// over, so that it can start the next turn at once.
	e.mu.Lock()
	delete(e.turns, t)
	e.endRunning()
	e.mu.Unlock()
	s := t.sess
	if t.kept {
		s.mu.Lock()
		s.turns++
		s.mu.Unlock()
	}
	s.release()
	t.emitLast(last)
	close(t.events)
}

// settle closes t's codec stream, settles the history and returns the
// turn's terminal event.
func (e *Engine) settle(t *turn, err error) Event {
	if t.codec != nil {
		t.codec.Close()
		t.codec = nil
	}
	if err == nil {
		err = t.failed() // e.g. cancelled after the last step
	}
	var sp *StagePanic
	switch {
	case errors.As(err, &sp):
		// A stage broke down part-way: the history and the cache may be
		// half updated. Forget the turn and the cache.
		forget(t, true)
	case err == nil && t.req.prefill:
		// Engine.Prefill's turn: its rows stay, computed; no reply to end.
	case err == nil || t.tm.Steps > 0:
		// The reply so far stays in the history (a cancelled turn keeps
		// what the model said, as after a barge-in), closed by <|im_end|>.
		t.sess.chat.EndTurn()
		t.kept = true
	default:
		// Nothing was generated: forget the turn.
		forget(t, false)
	}
	t.tm.Total = time.Since(t.start)
	if t.tm.AudioSeconds > 0 {
		t.tm.RTF = t.tm.Total.Seconds() / t.tm.AudioSeconds
	}
	if err != nil {
		return &ErrorEvent{Err: err, Timings: t.timings()}
	}
	if tail := t.dec.Flush(); tail != "" {
		t.text.WriteString(tail)
		t.emit(&TextEvent{Delta: tail, Token: -1})
	}
	return &DoneEvent{Text: t.text.String(), Stop: t.sm.Stopped(), Timings: t.timings()}
}

// forget drops t's rows from its conversation. If the cache took any of
// them, or broken says a stage broke down while it held the turn, the cache
// no longer matches the history: the next turn prefills the history afresh.
func forget(t *turn, broken bool) {
	s := t.sess
	t.kept = false
	s.chat.Truncate(t.chatStart)
	if (broken || s.fed > t.chatStart) && s.cache != nil {
		s.cache.Free()
		s.cache, s.fed = nil, 0
	}
}

// forgetBroken is forget(t, true) where a panic while settling t leaves
// the device in doubt: should freeing the cache panic too, the cache is
// dropped unfreed.
func forgetBroken(t *turn) {
	defer func() {
		if recover() != nil {
			t.sess.cache, t.sess.fed = nil, 0
		}
	}()
	forget(t, true)
}

// timings returns a copy of t's timings.
func (t *turn) timings() Timings {
	t.busyMu.Lock()
	defer t.busyMu.Unlock()
	tm := t.tm
	tm.Busy = maps.Clone(t.tm.Busy)
	return tm
}

// stepsOf returns the step each turn of a loop stage's batch is at.
func stepsOf(ts []*turn) []int {
	steps := make([]int, len(ts))
	for i, t := range ts {
		steps[i] = t.sm.Steps() - 1
	}
	return steps
}

// record attributes a stage's batch time to its turns and to the trace
// (steps as Interval.Steps).
func (e *Engine) record(stage string, ts []*turn, steps []int, start time.Time, label string) {
	e.recordRows(stage, ts, steps, nil, start, label)
}

// recordRows is record with the rows each turn fed the stage.
func (e *Engine) recordRows(stage string, ts []*turn, steps, rows []int, start time.Time, label string) {
	end := time.Now()
	d := end.Sub(start)
	share := d / time.Duration(len(ts))
	for _, t := range ts {
		t.addBusy(stage, share)
	}
	if e.opts.Trace != nil {
		ids := make([]uint64, len(ts))
		for i, t := range ts {
			ids[i] = t.id
		}
		e.opts.Trace.add(Interval{Stage: stage, Turns: ids, Steps: steps, Rows: rows, Start: start, End: end, Label: label})
	}
}

// hostPicks reports whether a frame of batch must pick on the host: a
// teacher overrides picks, or a recording keeps every codebook's logits.
func hostPicks(batch []*turn) bool {
	for _, t := range batch {
		if t.req.Teacher != nil || t.req.Record != nil {
			return true
		}
	}
	return false
}

// sampleRows returns the device sampling rows of a frame: rows[i][r] for
// codebook i of batch row r, made codebook by codebook, so that each
// turn's sampler draws in the order the host picks would.
func sampleRows(batch []*turn, codebooks int) [][]gpu.SampleRow {
	rows := make([][]gpu.SampleRow, codebooks)
	for i := range rows {
		rows[i] = make([]gpu.SampleRow, len(batch))
		for r, t := range batch {
			rows[i][r] = t.audioS.Row(t.audioH[i])
		}
	}
	return rows
}
