// Package parity runs a recorded reference case (a file made with the
// official code: its conversation, settings, input audio, traces and
// intermediates) through omni-pipe and compares every stage with it, each
// against a stated tolerance. It backs `omni-pipe parity`.
//
// Tolerances come from the reference's own error: a bf16 run is off the
// exact result by its rounding noise. omni-pipe runs every case twice — in
// BF16 mode (reproducing the reference's rounding points) and in F32 mode
// (close to exact). The F32 run's distance to the reference estimates the
// reference's noise at each stage; the BF16 run may then differ from the
// reference by at most twice that in relative L2 (both sides carry that
// much noise; independent errors add to about √2 of it). Where
// the reference file has a float64 companion (NAME_f64.safetensors), the
// F32 run must also be no farther from it than the reference is. Greedy
// picks must agree except at near-ties: a miss is allowed only where the
// reference's own top-1 margin is within twice the logit noise.
package parity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/depth"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// Row is one line of the stage table.
type Row struct {
	Stage  string
	Value  string // what was measured
	Bound  string // the tolerance
	OK     bool
	Detail []string // misses and their margins
}

// Report is the outcome of a case.
type Report struct {
	Case string
	Rows []Row
}

// OK reports whether every stage is within tolerance.
func (r *Report) OK() bool {
	for _, row := range r.Rows {
		if !row.OK {
			return false
		}
	}
	return len(r.Rows) > 0
}

// Print writes the stage table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "parity: %s\n", r.Case)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "stage\tmeasured\ttolerance\tok")
	for _, row := range r.Rows {
		ok := "ok"
		if !row.OK {
			ok = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", row.Stage, row.Value, row.Bound, ok)
	}
	tw.Flush()
	for _, row := range r.Rows {
		for _, d := range row.Detail {
			fmt.Fprintf(w, "  %s: %s\n", row.Stage, d)
		}
	}
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s\n", verdict)
}

func (r *Report) add(row Row) { r.Rows = append(r.Rows, row) }

// Run replays the case in ref with model m on dev and compares it.
func Run(ctx context.Context, m *lfm2audio.Model, dev gpu.Device, ref *refcase.Case) (*Report, error) {
	rep := &Report{Case: ref.Path}
	if ref.Gen.Mode != "" && ref.Gen.Mode != "interleaved" && ref.Gen.Mode != "sequential" {
		return nil, fmt.Errorf("%s: unknown generation mode %q", ref.Path, ref.Gen.Mode)
	}
	bf, err := Replay(ctx, m, dev, ref, nn.BF16)
	if err != nil {
		return nil, fmt.Errorf("bf16 run: %w", err)
	}
	f32, err := Replay(ctx, m, dev, ref, nn.F32)
	if err != nil {
		return nil, fmt.Errorf("f32 run: %w", err)
	}
	c := &comparer{ref: ref, bf: bf, f32: f32, rep: rep}
	c.frontEnd()
	c.prompt()
	c.backbone()
	if err := c.depthOnReferenceStates(m, dev); err != nil {
		return nil, err
	}
	c.loopCodes()
	if err := c.codec(ctx, m); err != nil {
		return nil, err
	}
	return rep, nil
}

// Replay runs the conversation: earlier turns as recorded, then the file's
// own assistant turn teacher-forced with its trace, recorded.
func Replay(ctx context.Context, m *lfm2audio.Model, dev gpu.Device, ref *refcase.Case, p nn.Precision) (*pipeline.Recorder, error) {
	e := pipeline.New(m, dev, pipeline.Options{Precision: p, MaxTurns: 1})
	defer e.Close()
	s := e.NewSession()
	defer s.Close()
	mode := pipeline.Interleaved
	if ref.Gen.Mode == "sequential" {
		mode = pipeline.Sequential
	}
	// Earlier turns record too: a clip of an earlier turn (case4's) is the
	// file's mel and encoder output.
	pre := pipeline.NewRecorder()
	req := pipeline.Request{System: ref.System, Mode: mode, Record: pre}
	pendingUser := false
	run := func(r pipeline.Request) error {
		st, err := e.Start(ctx, s, r)
		if err != nil {
			return err
		}
		for ev := range st.Events {
			if ee, ok := ev.(*pipeline.ErrorEvent); ok {
				return ee.Err
			}
		}
		return nil
	}
	for _, turn := range ref.Turns {
		switch {
		case turn.Role == "user" && turn.Audio != "":
			clip, err := ref.Clip(turn.Audio)
			if err != nil {
				return nil, err
			}
			req.Audio, pendingUser = clip, true
		case turn.Role == "user":
			req.Text, pendingUser = turn.Text, true
		case turn.Role == "assistant" && turn.Trace != "":
			tr, err := ref.Trace(turn.Trace)
			if err != nil {
				return nil, err
			}
			req.MaxNewTokens, req.Teacher = tr.Steps(), &teacher{tr: tr}
			if err := run(req); err != nil {
				return nil, fmt.Errorf("replaying %s: %w", turn.Trace, err)
			}
			req = pipeline.Request{Mode: mode, Record: pre}
			pendingUser = false
		default:
			return nil, fmt.Errorf("unsupported recorded turn %+v", turn)
		}
	}
	if !pendingUser {
		return nil, errors.New("the recorded conversation does not end with a user turn")
	}
	tr, err := ref.Trace("")
	if err != nil {
		return nil, err
	}
	rec := pipeline.NewRecorder()
	req.MaxNewTokens, req.Teacher, req.Record = tr.Steps(), &teacher{tr: tr}, rec
	if err := run(req); err != nil {
		return nil, err
	}
	for _, n := range []string{"input_wav", "wav_16k", "mel_f32", "mel", "encoder_out", "adapter_out"} {
		if _, _, ok := rec.Floats(n); !ok {
			if v, shape, ok := pre.Floats(n); ok {
				rec.SetFloats(n, v, shape...)
			}
		}
	}
	return rec, nil
}

// teacher feeds the recorded trace back instead of the engine's picks.
type teacher struct{ tr *refcase.Trace }

func (t *teacher) Text(step, picked int, _ []float32) int {
	if step < t.tr.Steps() && t.tr.Modality[step] == 1 {
		return t.tr.Tokens[step]
	}
	return picked // the trace diverged in kind: nothing to force
}

func (t *teacher) AudioCode(step, cb, picked int, _ []float32) int {
	if step < t.tr.Steps() && t.tr.Codes[step] != nil {
		return t.tr.Codes[step][cb]
	}
	return picked
}

type comparer struct {
	ref     *refcase.Case
	bf, f32 *pipeline.Recorder
	rep     *Report
	// noise yardsticks (F32 run vs reference)
	hiddenNoise, logitNoise, audioNoise float64
}

func fmtDiff(d numcmp.Diff) string {
	return fmt.Sprintf("max|Δ| %.3g, cos %.6f", d.MaxAbs, d.Cosine)
}

// tail returns the last n·cols values of v (the rows of a turn when a
// reference re-prefilled the whole conversation).
func tail(v []float32, n, cols int) []float32 { return v[len(v)-n*cols:] }

// compareNoisy adds a row comparing the BF16 run's tensor with the
// reference's, bounded by twice the F32 run's distance; it returns that
// noise.
func (c *comparer) compareNoisy(stage, name string, floor float64) float64 {
	want, err := c.ref.Floats(name)
	if err != nil {
		return 0
	}
	got, gshape, ok := c.bf.Floats(name)
	g32, _, ok32 := c.f32.Floats(name)
	if !ok || !ok32 || len(gshape) == 0 {
		c.rep.add(Row{Stage: stage, Value: "missing from the run", OK: false})
		return 0
	}
	cols := gshape[len(gshape)-1]
	if len(gshape) == 1 {
		cols = len(got)
	}
	if len(got) > len(want) || len(got)%cols != 0 {
		c.rep.add(Row{Stage: stage, Value: fmt.Sprintf("%d values, reference %d", len(got), len(want))})
		return 0
	}
	w := tail(want, len(got)/cols, cols)
	n32 := numcmp.Compare(g32, w)
	noise := math.Max(n32.MaxAbs, floor)
	d := numcmp.Compare(got, w)
	// Two runs that each carry bf16 noise of relative size r differ by about
	// √2·r (independent errors): the BF16 run must stay within 2·r, where r
	// is the F32 run's distance to the reference (its noise estimate). The
	// relative L2 distance is the criterion because it averages over every
	// element; the max, an extreme-value statistic of chaotic error growth,
	// is reported beside it.
	c.rep.add(Row{Stage: stage,
		Value: fmt.Sprintf("rel L2 %.3g, max|Δ| %.3g, cos %.6f", d.RelL2, d.MaxAbs, d.Cosine),
		Bound: fmt.Sprintf("rel L2 ≤ 2×%.3g (f32 run's; its max|Δ| %.3g)", n32.RelL2, n32.MaxAbs),
		OK:    d.RelL2 <= 2*n32.RelL2 && d.NaNs == 0})
	return noise
}

func (c *comparer) frontEnd() {
	if c.ref.Has("wav_16k") {
		want, _ := c.ref.Floats("wav_16k")
		got, _, ok := c.f32.Floats("wav_16k")
		if ok && len(got) == len(want) {
			d := numcmp.Compare(got, want)
			// torchaudio's resampler runs in float32: its output carries
			// float32 rounding of a ~100-tap sum (≈1e-6 relative).
			c.rep.add(Row{Stage: "resample 16k", Value: fmt.Sprintf("max|Δ| %.3g, SNR %.1f dB", d.MaxAbs, d.SNRdB), Bound: "SNR ≥ 80 dB", OK: d.SNRdB >= 80})
		} else {
			c.rep.add(Row{Stage: "resample 16k", Value: fmt.Sprintf("%d samples, reference %d", len(got), len(want))})
		}
	}
	if c.ref.Has("mel_f32") {
		c.mel()
	}
	if c.ref.Has("encoder_out") {
		c.compareNoisy("encoder out", "encoder_out", 0)
		c.compareNoisy("adapter out", "adapter_out", 0)
	}
}

// mel compares the front end: the float32 features, then the bf16 cast the
// encoder receives.
func (c *comparer) mel() {
	want32, _ := c.ref.Floats("mel_f32")
	got32, _, ok := c.f32.Floats("mel_f32")
	if !ok || len(got32) != len(want32) {
		c.rep.add(Row{Stage: "mel (f32)", Value: fmt.Sprintf("%d values, reference %d", len(got32), len(want32))})
		return
	}
	d32 := numcmp.Compare(got32, want32)
	// The reference runs the STFT, mel product, log and normalisation in
	// float32 (relative rounding ~6e-8 per op over a 512-point FFT and a
	// 257-term dot product): a relative L2 distance above 1e-5 would be a
	// wrong formula, not rounding.
	c.rep.add(Row{Stage: "mel (f32)", Value: fmt.Sprintf("max|Δ| %.3g, rel L2 %.3g", d32.MaxAbs, d32.RelL2), Bound: "rel L2 ≤ 1e-5", OK: d32.RelL2 <= 1e-5 && d32.NaNs == 0})
	want, _ := c.ref.Floats("mel")
	got, _, ok := c.bf.Floats("mel")
	if !ok || len(got) != len(want) {
		c.rep.add(Row{Stage: "mel (bf16)", Value: fmt.Sprintf("%d values, reference %d", len(got), len(want))})
		return
	}
	// Casting to bf16 turns the float32 disagreement into at most one bf16
	// ulp where a value sits at a rounding boundary: each element must be
	// within one ulp of the larger magnitude plus the float32 distance.
	flips, bad := 0, 0
	for i := range got {
		if got[i] == want[i] {
			continue
		}
		flips++
		a := math.Max(math.Abs(float64(got[i])), math.Abs(float64(want[i])))
		ulp := math.Ldexp(1, math.Ilogb(a)-7)
		if math.Abs(float64(got[i]-want[i])) > ulp+d32.MaxAbs {
			bad++
		}
	}
	c.rep.add(Row{Stage: "mel (bf16)", Value: fmt.Sprintf("%d of %d differ (bf16 rounding flips)", flips, len(got)), Bound: "each ≤ 1 ulp + f32 distance", OK: bad == 0})
}

func (c *comparer) prompt() {
	for _, name := range []string{"prompt_text_ids", "prompt_modality", "prompt_audio_out"} {
		want, err := c.ref.Ints(name)
		if err != nil {
			continue
		}
		got, _, _ := c.bf.Ints(name)
		ok := slices.Equal(got, want)
		v := "identical"
		if !ok {
			v = fmt.Sprintf("%d values differ from the reference's %d", len(got), len(want))
		}
		c.rep.add(Row{Stage: strings.ReplaceAll(name, "_", " "), Value: v, Bound: "exact", OK: ok})
	}
}

func (c *comparer) backbone() {
	c.hiddenNoise = c.compareNoisy("prefill rows", "prefill_hidden", 0)
	c.logitNoise = c.compareNoisy("prefill text logits", "prefill_text_logits", 0)
	// The float64 companion, where there is one.
	f64path := strings.TrimSuffix(c.ref.Path, ".safetensors") + "_f64.safetensors"
	if _, err := os.Stat(f64path); err == nil {
		if rc, err := refcase.OpenTensors(f64path); err == nil {
			defer rc.Close()
			c.f64Row(rc, "prefill text logits vs float64", "prefill_text_logits", "prefill_text_logits_f64")
			c.f64Row(rc, "prefill rows vs float64", "prefill_hidden", "prefill_hidden_f64")
		}
	}
	// Teacher-forced steps: the rows, and the text top-1.
	want, _ := c.ref.Floats("step_hidden")
	got, shape, ok := c.bf.Floats("step_hidden")
	if ok && len(got) == len(want) {
		d := numcmp.Compare(got, want)
		g32, _, _ := c.f32.Floats("step_hidden")
		n32 := numcmp.Compare(g32, want)
		c.rep.add(Row{Stage: "step rows (teacher-forced)",
			Value: fmt.Sprintf("rel L2 %.3g, max|Δ| %.3g, cos %.6f", d.RelL2, d.MaxAbs, d.Cosine),
			Bound: fmt.Sprintf("rel L2 ≤ 2×%.3g (f32 run's; its max|Δ| %.3g)", n32.RelL2, n32.MaxAbs),
			OK:    d.RelL2 <= 2*n32.RelL2 && d.NaNs == 0})
	} else {
		c.rep.add(Row{Stage: "step rows (teacher-forced)", Value: fmt.Sprintf("shape %v", shape)})
	}
	mod, _ := c.ref.Ints("step_modality")
	tok, _ := c.ref.Ints("step_text_token")
	refMargin, _ := c.ref.Floats("step_text_margin")
	ours, _, _ := c.bf.Ints("step_text_token")
	ourMargin, _, _ := c.bf.Floats("step_text_margin")
	row := Row{Stage: "text top-1 (teacher-forced)", Bound: fmt.Sprintf("misses only at near-ties (reference margin ≤ %.3g)", 2*c.logitNoise), OK: len(ours) == len(tok)}
	agree, n := 0, 0
	for s := range min(len(ours), len(tok)) {
		if mod[s] != 1 {
			continue
		}
		n++
		if ours[s] == tok[s] {
			agree++
			continue
		}
		near := float64(refMargin[s]) <= 2*c.logitNoise
		row.OK = row.OK && near
		row.Detail = append(row.Detail, fmt.Sprintf("step %d: ours %d (margin %.4g), reference %d (margin %.4g)%s", s, ours[s], ourMargin[s], tok[s], refMargin[s], map[bool]string{true: " near-tie", false: " NOT a near-tie"}[near]))
	}
	row.Value = fmt.Sprintf("%d/%d agree", agree, n)
	c.rep.add(row)
}

func (c *comparer) f64Row(rc *refcase.Case, stage, name, name64 string) {
	exact, err := rc.Floats(name64)
	if err != nil {
		return
	}
	want, _ := c.ref.Floats(name)
	got, _, ok := c.f32.Floats(name)
	if !ok || len(got) != len(exact) || len(want) != len(exact) {
		return
	}
	ours, theirs := numcmp.Compare(got, exact), numcmp.Compare(want, exact)
	c.rep.add(Row{Stage: stage, Value: fmt.Sprintf("f32 run max|Δ| %.3g; reference bf16 %.3g", ours.MaxAbs, theirs.MaxAbs),
		Bound: "ours ≤ reference's", OK: ours.MaxAbs <= theirs.MaxAbs})
}

// depthOnReferenceStates feeds the reference's own backbone row of every
// audio step to the depthformer and compares the greedy codes.
func (c *comparer) depthOnReferenceStates(m *lfm2audio.Model, dev gpu.Device) error {
	mod, err := c.ref.Ints("step_modality")
	if err != nil {
		return nil
	}
	hidden, _ := c.ref.Floats("step_hidden")
	codes, _ := c.ref.Ints("step_codes")
	margins, _ := c.ref.Floats("step_audio_margin")
	idx, _ := c.ref.Ints("audio_logits_step_idx")
	stored, _ := c.ref.Floats("audio_logits")
	H, CB := m.Cfg.LFM.HiddenSize, m.Cfg.Codebooks
	frame := func(p nn.Precision, s int) (picks []int, logits [][]float32, err error) {
		ctx := nn.NewCtx(dev, dev.NewQueue("parity"), p)
		h := ctx.Tmp(1, H)
		ctx.Q.Write(h, hidden[s*H:(s+1)*H])
		picks = make([]int, CB)
		_, err = m.Depth.Frame(ctx, h, func(_, i int, l []float32) int {
			picks[i] = numcmp.Argmax(l)
			logits = append(logits, slices.Clone(l))
			return codes[s*CB+i] // teacher-forced within the frame
		})
		ctx.A.Free()
		return picks, logits, err
	}
	// Noise: the F32 depthformer's distance to the stored reference logits.
	noise := 0.0
	for k, s := range idx {
		_, l32, err := frame(nn.F32, s)
		if err != nil {
			return err
		}
		for i := range CB {
			off := (k*CB + i) * depth.Vocab
			noise = math.Max(noise, numcmp.Compare(l32[i], stored[off:off+depth.Vocab]).MaxAbs)
		}
	}
	row := Row{Stage: "depthformer greedy (reference states)", Bound: fmt.Sprintf("misses only at near-ties (reference margin ≤ %.3g)", 2*noise), OK: true}
	agree, n := 0, 0
	for s, md := range mod {
		if md != 3 || codes[s*CB] == depth.EOA {
			continue
		}
		picks, _, err := frame(nn.BF16, s)
		if err != nil {
			return err
		}
		for i := range CB {
			n++
			if picks[i] == codes[s*CB+i] {
				agree++
				continue
			}
			near := float64(margins[s*CB+i]) <= 2*noise
			row.OK = row.OK && near
			row.Detail = append(row.Detail, fmt.Sprintf("step %d codebook %d: ours %d, reference %d (reference margin %.4g)%s", s, i, picks[i], codes[s*CB+i], margins[s*CB+i], map[bool]string{true: " near-tie", false: " NOT a near-tie"}[near]))
		}
	}
	row.Value = fmt.Sprintf("%d/%d agree", agree, n)
	c.audioNoise = noise
	c.rep.add(row)
	return nil
}

// loopCodes compares the codes the engine picked at every audio step of the
// teacher-forced loop (its own backbone rows) with the reference's.
func (c *comparer) loopCodes() {
	want, err := c.ref.Ints("step_codes")
	if err != nil {
		return
	}
	got, _, _ := c.bf.Ints("step_codes")
	refM, _ := c.ref.Floats("step_audio_margin")
	mod, _ := c.ref.Ints("step_modality")
	// In the loop the depthformer sees our own backbone rows, which carry
	// the reference's backbone noise on top: the yardstick is the F32 run's
	// loop logits against the reference's stored ones, at the stored steps.
	noise := c.audioNoise
	if refIdx, err := c.ref.Ints("audio_logits_step_idx"); err == nil {
		stored, _ := c.ref.Floats("audio_logits")
		ourIdx, _, _ := c.f32.Ints("audio_logits_step_idx")
		ours, _, _ := c.f32.Floats("audio_logits")
		at := map[int]int{}
		for k, s := range ourIdx {
			at[s] = k
		}
		per := len(stored) / max(len(refIdx), 1)
		for k, s := range refIdx {
			if j, ok := at[s]; ok && (j+1)*per <= len(ours) {
				noise = math.Max(noise, numcmp.Compare(ours[j*per:(j+1)*per], stored[k*per:(k+1)*per]).MaxAbs)
			}
		}
	}
	bound := 2 * noise
	row := Row{Stage: "codes through the loop (teacher-forced)", Bound: fmt.Sprintf("misses only at near-ties (reference margin ≤ %.3g)", bound), OK: len(got) == len(want)}
	CB := len(want) / max(len(mod), 1)
	agree, n := 0, 0
	for s := range min(len(got), len(want)) / max(CB, 1) {
		if mod[s] != 3 || want[s*CB] == depth.EOA {
			continue
		}
		for i := range CB {
			n++
			if got[s*CB+i] == want[s*CB+i] {
				agree++
				continue
			}
			near := float64(refM[s*CB+i]) <= bound
			row.OK = row.OK && near
			row.Detail = append(row.Detail, fmt.Sprintf("step %d codebook %d: ours %d, reference %d (reference margin %.4g)%s", s, i, got[s*CB+i], want[s*CB+i], refM[s*CB+i], map[bool]string{true: " near-tie", false: " NOT a near-tie"}[near]))
		}
	}
	row.Value = fmt.Sprintf("%d/%d agree", agree, n)
	c.rep.add(row)
}

// codec decodes the reference's codes whole and streamed and compares
// both with the reference's waveforms.
func (c *comparer) codec(ctx context.Context, m *lfm2audio.Model) error {
	codes, err := c.ref.Ints("mimi_codes")
	if err != nil {
		return nil
	}
	batch, _ := c.ref.Floats("wav_mimi_batch")
	stream, _ := c.ref.Floats("wav_mimi_stream")
	shape := c.ref.Shape("mimi_codes")
	CB, T := shape[0], shape[1]
	if CB != m.Codec.Codebooks() || T == 0 {
		return nil
	}
	frames := make([][]int, T)
	for f := range T {
		frames[f] = make([]int, CB)
		for i := range CB {
			frames[f][i] = codes[i*T+f]
		}
	}
	whole, err := m.Codec.Decode(ctx, frames)
	if err != nil {
		return fmt.Errorf("codec: %w", err)
	}
	st := m.Codec.NewStream()
	defer st.Close()
	var streamed []float32
	for f := range frames {
		pcm, err := st.DecodeFrames(ctx, frames[f:f+1])
		if err != nil {
			return fmt.Errorf("codec: %w", err)
		}
		streamed = append(streamed, pcm...)
	}
	refSelf := numcmp.Compare(stream, batch).MaxAbs
	// The reference's own streamed-vs-whole difference measures its fp32
	// reordering noise; ours may differ from it by a few times that.
	tol := math.Max(4*refSelf, 2e-5)
	dw, ds := numcmp.Compare(whole, batch), numcmp.Compare(streamed, stream)
	c.rep.add(Row{Stage: "codec whole decode", Value: fmt.Sprintf("max|Δ| %.3g, SNR %.1f dB", dw.MaxAbs, dw.SNRdB), Bound: fmt.Sprintf("max|Δ| ≤ %.3g", tol), OK: dw.MaxAbs <= tol})
	c.rep.add(Row{Stage: "codec streamed decode", Value: fmt.Sprintf("max|Δ| %.3g, SNR %.1f dB", ds.MaxAbs, ds.SNRdB), Bound: fmt.Sprintf("max|Δ| ≤ %.3g", tol), OK: ds.MaxAbs <= tol})
	same := slices.Equal(whole, streamed)
	c.rep.add(Row{Stage: "codec streamed == whole", Value: map[bool]string{true: "bit-identical", false: "differs"}[same], Bound: "bit-identical", OK: same})
	return nil
}
