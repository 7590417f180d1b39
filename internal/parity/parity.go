// Package parity runs a recorded reference case (a file made with the
// official code: its conversation, settings, input audio, traces and
// intermediates) through omni-pipe and compares every stage with it, each
// against a stated tolerance. It backs `omni-pipe parity`.
//
// Tolerances come from the reference's own error. omni-pipe runs every case
// in BF16 mode (reproducing the reference's rounding points) and in F32
// mode (close to exact); the F32 run's distance to the reference estimates
// the reference's bf16 noise at each stage. Three kinds of run:
//
//   - the engine replaying the conversation teacher-forced with the trace
//     (and once free-running): the front end is compared from it, the
//     resampler alone (SNR ≥ 120 dB against the reference's 16 kHz
//     waveform), the log-mel features on the reference's own 16 kHz
//     waveform (within 4 times the distance a plain float32 FFT alone puts
//     between features and float64 ones on that input, measured at run
//     time), the encoder and the adapter (relative L2 ≤ √2 × the F32 run's);
//   - the backbone and the heads fed the reference's own prompt rows and
//     teacher-forced with its trace (stagerun.go says why): prefill rows,
//     text logits and step rows within √2 × the F32 run's distance, and
//     within 1.25 × the reference bf16's distance of the float64 companion
//     (NAME_f64.safetensors) where there is one, which the engine's F32 run
//     must be no farther from than the reference bf16; in the
//     teacher-forced loop each miss is within √2 times the largest margin
//     shift of the F32 run over all its picks (noiseBound, at least 8
//     ulps), and the run misses no more picks than the F32 run where it
//     shares the reference's rounding, else its shifts' rms is within √2
//     times the F32 run's (noiseRule); a free-running greedy run leaves the
//     trace at the loop's first miss, within 2 ulps where the run shares
//     the reference's rounding;
//   - the depthformer fed the reference's own backbone rows: every miss
//     within 2 ulps.
//
// Misses are measured by the reference's top-1 margin in bf16 ulps of its
// top logit (rules.go) and listed with both picks. The engine's own loop,
// whose backbone sees its own front end's rows, may miss only within the
// same noiseBound of the F32 engine run's shifts, teacher-forced, its
// shifts within noiseRule, and its free run must leave the trace at the
// teacher-forced run's first miss.
package parity

import (
	"context"
	"encoding/json"
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
	// Picks are every pick of the runs that see their own rows, as each
	// run saw it: what the pick rules summarise, for study (WritePicks).
	Picks []Pick
}

// A Pick is one of the reference's picks as one run saw it. Ulps are of
// the run's logit of the reference's pick.
type Pick struct {
	Run      string `json:"run"`      // "loop bf16", "loop f32", "engine bf16", "engine f32"
	Step     int    `json:"step"`     // the trace's step
	Codebook int    `json:"codebook"` // −1: a text token
	Ref      int    `json:"ref"`      // the reference's pick
	Ours     int    `json:"ours"`     // the run's pick
	// RefMarginUlps is the reference's top-1 margin, ShiftUlps the run's
	// margin for the reference's pick minus it (marginShift): negative
	// past −RefMarginUlps is a miss.
	RefMarginUlps float64 `json:"ref_margin_ulps"`
	ShiftUlps     float64 `json:"shift_ulps"`
}

// WritePicks writes the report's picks as JSON lines.
func (r *Report) WritePicks(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, p := range r.Picks {
		if err := enc.Encode(p); err != nil {
			return fmt.Errorf("parity: write picks: %w", err)
		}
	}
	return nil
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
	free, err := replay(ctx, m, dev, ref, nn.BF16, false)
	if err != nil {
		return nil, fmt.Errorf("free-running bf16 run: %w", err)
	}
	c := &comparer{ref: ref, bf: bf, f32: f32, free: free, rep: rep, eoa: m.Special.EOA}
	if ref.Has("prompt_modality") && ref.Has("step_modality") {
		if c.sbf, err = runStages(m, dev, ref, nn.BF16); err != nil {
			return nil, fmt.Errorf("bf16 stages on the reference's rows: %w", err)
		}
		if c.s32, err = runStages(m, dev, ref, nn.F32); err != nil {
			return nil, fmt.Errorf("f32 stages on the reference's rows: %w", err)
		}
	}
	if err := c.frontEnd(m); err != nil {
		return nil, err
	}
	c.prompt()
	if c.sbf != nil {
		c.backbone()
		c.loops()
	}
	if err := c.depthOnReferenceStates(m, dev); err != nil {
		return nil, err
	}
	if c.sbf != nil {
		c.freeRunning()
	}
	c.endToEnd()
	if err := c.codec(ctx, m); err != nil {
		return nil, err
	}
	return rep, nil
}

// Replay runs the conversation: earlier turns as recorded, then the file's
// own assistant turn teacher-forced with its trace, recorded.
func Replay(ctx context.Context, m *lfm2audio.Model, dev gpu.Device, ref *refcase.Case, p nn.Precision) (*pipeline.Recorder, error) {
	return replay(ctx, m, dev, ref, p, true)
}

// replay is Replay; with forced false the file's own turn runs free (greedy
// as the reference, as many steps), only the earlier turns replayed.
func replay(ctx context.Context, m *lfm2audio.Model, dev gpu.Device, ref *refcase.Case, p nn.Precision, forced bool) (*pipeline.Recorder, error) {
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
	if !forced {
		req.Teacher = nil
	}
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
	bf, f32 *pipeline.Recorder // the engine's teacher-forced runs
	free    *pipeline.Recorder // the engine's free-running BF16 run
	sbf     *stageRun          // the stages on the reference's own rows, BF16
	s32     *stageRun          // … and F32
	rep     *Report
	eoa     int // the model's end-of-audio code (lfm2audio.Special.EOA)
	// sharesRounding: the BF16 stage run's prefill rows are within
	// sharedRounding of the F32 run's distance to the reference (backbone
	// sets it).
	sharesRounding bool
}

// tail returns the last n·cols values of v (the rows of a turn when a
// reference re-prefilled the whole conversation).
func tail(v []float32, n, cols int) []float32 { return v[len(v)-n*cols:] }

// sqrt2 bounds the BF16 run's distance to the reference by the F32 run's:
// two runs that each carry bf16 noise of relative size r, independently,
// differ by about √2·r; where the BF16 run reproduces the reference's
// rounding points it is much closer than that.
var sqrt2 = math.Sqrt2

// compareNoisy adds a row comparing the engine's BF16 run's tensor with the
// reference's, bounded by √2 times the F32 run's distance.
func (c *comparer) compareNoisy(stage, name string) {
	want, err := c.ref.Floats(name)
	if err != nil {
		return
	}
	got, gshape, ok := c.bf.Floats(name)
	g32, _, ok32 := c.f32.Floats(name)
	if !ok || !ok32 || len(gshape) == 0 {
		c.rep.add(Row{Stage: stage, Value: "missing from the run"})
		return
	}
	cols := gshape[len(gshape)-1]
	if len(gshape) == 1 {
		cols = len(got)
	}
	if len(got) > len(want) || len(got)%cols != 0 || len(g32) != len(got) {
		c.rep.add(Row{Stage: stage, Value: fmt.Sprintf("%d values, reference %d", len(got), len(want))})
		return
	}
	w := tail(want, len(got)/cols, cols)
	c.rep.add(noisyRow(stage, numcmp.Compare(got, w), numcmp.Compare(g32, w)))
}

// noisyRow is the √2 rule in relative L2 (it averages over every element;
// the max, an extreme-value statistic of chaotic error growth, is reported
// beside it): d is the BF16 run's distance to the reference, d32 the F32
// run's.
func noisyRow(stage string, d, d32 numcmp.Diff) Row {
	return Row{Stage: stage,
		Value: fmt.Sprintf("rel L2 %.3g, max|Δ| %.3g, cos %.6f", d.RelL2, d.MaxAbs, d.Cosine),
		Bound: fmt.Sprintf("rel L2 ≤ √2×%.3g (f32 run's; its max|Δ| %.3g)", d32.RelL2, d32.MaxAbs),
		OK:    d.RelL2 <= sqrt2*d32.RelL2 && d.NaNs == 0 && d32.NaNs == 0}
}

// compareStages adds a √2-rule row for a tensor of the stage runs and
// returns the BF16 and F32 runs' distances (ok false where there are none).
func (c *comparer) compareStages(stage, name string, got, got32 []float32) (d, d32 numcmp.Diff, ok bool) {
	want, err := c.ref.Floats(name)
	if err != nil {
		return d, d32, false
	}
	if len(got) != len(want) || len(got32) != len(want) {
		c.rep.add(Row{Stage: stage, Value: fmt.Sprintf("%d values, reference %d", len(got), len(want))})
		return d, d32, false
	}
	d, d32 = numcmp.Compare(got, want), numcmp.Compare(got32, want)
	c.rep.add(noisyRow(stage, d, d32))
	return d, d32, true
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

// backbone compares the stage runs' rows and text logits, and both kinds
// of run with the float64 companion where there is one.
func (c *comparer) backbone() {
	d, d32, ok := c.compareStages("prefill rows", "prefill_hidden", c.sbf.prefill, c.s32.prefill)
	c.sharesRounding = ok && d.NaNs == 0 && d32.NaNs == 0 && d.RelL2 <= sharedRounding*d32.RelL2
	c.compareStages("prefill text logits", "prefill_text_logits", c.sbf.prefillLogits, c.s32.prefillLogits)
	f64path := strings.TrimSuffix(c.ref.Path, ".safetensors") + "_f64.safetensors"
	if _, err := os.Stat(f64path); err == nil {
		if rc, err := refcase.OpenTensors(f64path); err == nil {
			defer rc.Close()
			c.f64Rows(rc, "prefill rows", "prefill_hidden", "prefill_hidden_f64", c.sbf.prefill)
			c.f64Rows(rc, "prefill text logits", "prefill_text_logits", "prefill_text_logits_f64", c.sbf.prefillLogits)
		}
	}
	c.compareStages("step rows (teacher-forced)", "step_hidden", c.sbf.hidden, c.s32.hidden)
}

// f64Rows compares runs with the float64 companion (made from the fp32
// mel, its encoder in float64 too): the engine's F32 run, a float32
// pipeline from its own front end, must be no farther from it than the
// reference bf16 (max|Δ|); the BF16 stage run at most 1.25 times as far as
// the reference bf16 in relative L2 (it carries the reference's bf16
// encoder rows and, where it reproduces the reference, its noise).
func (c *comparer) f64Rows(rc *refcase.Case, stage, name, name64 string, bf []float32) {
	exact, err := rc.Floats(name64)
	if err != nil {
		return
	}
	want, _ := c.ref.Floats(name)
	got32, _, ok32 := c.f32.Floats(name)
	if !ok32 || len(bf) != len(exact) || len(got32) != len(exact) || len(want) != len(exact) {
		c.rep.add(Row{Stage: stage + " vs float64", Value: fmt.Sprintf("%d values, float64 %d", len(bf), len(exact))})
		return
	}
	theirs := numcmp.Compare(want, exact)
	ours32, ours := numcmp.Compare(got32, exact), numcmp.Compare(bf, exact)
	c.rep.add(Row{Stage: stage + ", f32 run vs float64", Value: fmt.Sprintf("max|Δ| %.3g; reference bf16 %.3g", ours32.MaxAbs, theirs.MaxAbs),
		Bound: "≤ reference's", OK: ours32.MaxAbs <= theirs.MaxAbs && ours32.NaNs == 0})
	c.rep.add(Row{Stage: stage + ", bf16 run vs float64", Value: fmt.Sprintf("rel L2 %.3g (%.3g× the reference bf16's %.3g)", ours.RelL2, ours.RelL2/theirs.RelL2, theirs.RelL2),
		Bound: "≤ 1.25× reference's", OK: ours.RelL2 <= 1.25*theirs.RelL2 && ours.NaNs == 0})
}

// stored returns the reference's full logits of evaluation (step, cb) (cb
// −1: text), or nil where it stored none.
func (c *comparer) stored(step, cb, vocab int) []float32 {
	idxName, name := "text_logits_step_idx", "text_logits"
	if cb >= 0 {
		idxName, name = "audio_logits_step_idx", "audio_logits"
	}
	idx, err := c.ref.Ints(idxName)
	if err != nil || vocab == 0 {
		return nil
	}
	all, _ := c.ref.Floats(name)
	per := len(all) / max(len(idx), 1) // vocab, or codebooks·vocab
	for k, s := range idx {
		if s != step {
			continue
		}
		off := k * per
		if cb >= 0 {
			off += cb * vocab
		}
		if off+vocab <= len(all) {
			return all[off : off+vocab]
		}
	}
	return nil
}

// picks is a run's greedy picks and their logits, step by step.
type picks interface {
	token(s int) int // −1 where there is none
	code(s, i int) int
	logits(s, cb int) []float32 // cb −1: the text logits
}

func (r *stageRun) token(s int) int {
	if s < len(r.tokens) {
		return r.tokens[s]
	}
	return -1
}

func (r *stageRun) code(s, i int) int {
	CB := len(r.codes) / max(len(r.tokens), 1)
	if s < len(r.tokens) && i < CB {
		return r.codes[s*CB+i]
	}
	return -1
}

func (r *stageRun) logits(s, cb int) []float32 {
	if cb < 0 {
		return r.textLogits[s]
	}
	return r.audioLogits[[2]int{s, cb}]
}

// recorded is an engine run's picks, from its recorder.
type recorded struct {
	mod, tok, codes     []int
	cb                  int
	textIdx, audioIdx   map[int]int
	textL, audioL       []float32
	textV, audioV, nCBL int
}

func newRecorded(r *pipeline.Recorder) *recorded {
	p := &recorded{textIdx: map[int]int{}, audioIdx: map[int]int{}}
	p.mod, _, _ = r.Ints("step_modality")
	p.tok, _, _ = r.Ints("step_text_token")
	var shape []int
	p.codes, shape, _ = r.Ints("step_codes")
	if len(shape) == 2 {
		p.cb = shape[1]
	}
	ti, _, _ := r.Ints("text_logits_step_idx")
	ai, _, _ := r.Ints("audio_logits_step_idx")
	for k, s := range ti {
		p.textIdx[s] = k
	}
	for k, s := range ai {
		p.audioIdx[s] = k
	}
	p.textL, shape, _ = r.Floats("text_logits")
	if len(shape) == 2 {
		p.textV = shape[1]
	}
	p.audioL, shape, _ = r.Floats("audio_logits")
	if len(shape) == 3 {
		p.nCBL, p.audioV = shape[1], shape[2]
	}
	return p
}

func (p *recorded) token(s int) int {
	if s < len(p.tok) {
		return p.tok[s]
	}
	return -1
}

func (p *recorded) code(s, i int) int {
	if s < len(p.mod) && i < p.cb {
		return p.codes[s*p.cb+i]
	}
	return -1
}

func (p *recorded) logits(s, cb int) []float32 {
	if cb < 0 {
		k, ok := p.textIdx[s]
		if !ok || (k+1)*p.textV > len(p.textL) {
			return nil
		}
		return p.textL[k*p.textV : (k+1)*p.textV]
	}
	k, ok := p.audioIdx[s]
	off := (k*p.nCBL + cb) * p.audioV
	if !ok || cb >= p.nCBL || off+p.audioV > len(p.audioL) {
		return nil
	}
	return p.audioL[off : off+p.audioV]
}

// eachPick calls fn for each of the reference's picks in trace order, text
// tokens (text), audio codes (audio) or both, with the pick's step,
// codebook (−1: a text token), the reference's pick and its margin, and
// our pick in run r; it stops where fn returns false.
func (c *comparer) eachPick(r picks, text, audio bool, fn func(s, cb, ours, want int, margin float32) bool) {
	mod, _ := c.ref.Ints("step_modality")
	tok, _ := c.ref.Ints("step_text_token")
	codes, _ := c.ref.Ints("step_codes")
	tm, _ := c.ref.Floats("step_text_margin")
	am, _ := c.ref.Floats("step_audio_margin")
	CB := len(codes) / max(len(mod), 1)
	for s, md := range mod {
		switch {
		case md == 1 && text:
			if !fn(s, -1, r.token(s), tok[s], tm[s]) {
				return
			}
		case md == 3 && audio:
			k := CB
			if codes[s*CB] == c.eoa { // the reference forced the frame
				k = 1
			}
			for i := range k {
				if !fn(s, i, r.code(s, i), codes[s*CB+i], am[s*CB+i]) {
					return
				}
			}
		}
	}
}

// misses lists a run's picks that differ from the reference's trace, in
// trace order: text tokens (text), audio codes (audio), or both. It stops
// at the first with first set. n counts the picks compared.
func (c *comparer) misses(r picks, text, audio, first bool) (out []Miss, n int) {
	c.eachPick(r, text, audio, func(s, cb, ours, want int, margin float32) bool {
		n++
		if ours == want {
			return true
		}
		l := r.logits(s, cb)
		out = append(out, newMiss(s, cb, ours, want, float64(margin), l, c.stored(s, cb, len(l))))
		return !first
	})
	return out, n
}

// record adds run r's picks, text and audio, to the report's Picks (those
// without logits are left out): what the pick rules' noise is measured on
// (noise).
func (c *comparer) record(run string, r picks) {
	c.eachPick(r, true, true, func(s, cb, ours, want int, margin float32) bool {
		l := r.logits(s, cb)
		d := marginShift(l, want, float64(margin))
		if math.IsNaN(d) {
			return true
		}
		c.rep.Picks = append(c.rep.Picks, Pick{Run: run, Step: s, Codebook: cb, Ref: want, Ours: ours,
			RefMarginUlps: float64(margin) / ulp(float64(l[want])), ShiftUlps: d})
		return true
	})
}

// noise measures the recorded run's margin shifts over its text tokens
// (text), audio codes (audio) or both: the size of its noise against the
// reference's at every pick (noiseOf).
func (c *comparer) noise(run string, text, audio bool) noise {
	var d []float64
	for _, p := range c.rep.Picks {
		if p.Run == run && (text && p.Codebook < 0 || audio && p.Codebook >= 0) {
			d = append(d, p.ShiftUlps)
		}
	}
	return noiseOf(d)
}

// loops checks the teacher-forced loop on the reference's own rows: the
// text top-1 and the codes, each against the F32 stage run's misses.
func (c *comparer) loops() {
	if !c.ref.Has("step_modality") {
		return
	}
	c.record("loop bf16", c.sbf)
	c.record("loop f32", c.s32)
	for _, l := range []struct {
		stage       string
		text, audio bool
	}{
		{"text top-1 (teacher-forced)", true, false},
		{"codes through the loop (teacher-forced)", false, true},
	} {
		ms, n := c.misses(c.sbf, l.text, l.audio, false)
		m32, n32 := c.misses(c.s32, l.text, l.audio, false)
		if n == 0 {
			continue
		}
		z, z32 := c.noise("loop bf16", l.text, l.audio), c.noise("loop f32", l.text, l.audio)
		bound := noiseBound(z32)
		rule := fmt.Sprintf("shift rms ≤ √2× the f32 run's %.3g", z32.rms)
		if c.sharesRounding {
			rule = fmt.Sprintf("misses ≤ the f32 run's %d", len(m32))
		}
		row := Row{Stage: l.stage,
			Value: fmt.Sprintf("%d/%d agree (f32 run %d/%d)%s%s", n-len(ms), n, n32-len(m32), n32, worst(ms), shifts(z, z32)),
			Bound: fmt.Sprintf("%s; each miss ≤ %.3g ulps (√2× the f32 run's largest shift, ≥ %d)", rule, bound, loopUlps),
			OK:    loopRule(ms, m32, z, z32, c.sharesRounding) && n == n32}
		row.Detail = details(ms)
		c.rep.add(row)
	}
}

// shifts describes the runs' noise (noise), BF16 and F32.
func shifts(bf, f32 noise) string {
	if bf.n == 0 || f32.n == 0 {
		return ""
	}
	return fmt.Sprintf("; shift rms %.3g ulps, largest %.3g (f32 run %.3g, %.3g)", bf.rms, bf.reach, f32.rms, f32.reach)
}

// freeRunning checks where a free-running greedy run on the reference's own
// rows leaves the reference's trace: until then its inputs and so its picks
// are the teacher-forced run's, so it leaves at the teacher-forced stage
// run's first miss in trace order (the stage run records only the
// teacher-forced loop; this row names the step a free run keeps the trace
// to). Where the stage run shares the reference's rounding (sharesRounding)
// that first miss comes from a rounding or two: within depthUlps, as the
// depthformer's on the reference's rows. Where it does not, the first miss
// is one of the loop's, bounded like them.
func (c *comparer) freeRunning() {
	if !c.ref.Has("step_modality") || !greedy(c.ref.Gen.Text) || !greedy(c.ref.Gen.Audio) {
		return
	}
	ms, n := c.misses(c.sbf, true, true, true)
	var first *Miss
	if len(ms) > 0 {
		first = &ms[0]
	}
	bound := float64(depthUlps)
	if !c.sharesRounding {
		bound = noiseBound(c.noise("loop f32", true, true))
	}
	c.rep.add(divergenceRow("free-running greedy", first, first, n, bound))
}

// sharedRounding is the most the BF16 stage run's prefill rows may be from
// the reference's, as a fraction of the F32 run's distance, for the run to
// count as sharing the reference's rounding (comparer.sharesRounding). A
// run with the reference's rounding points whose products sum in the
// reference's order is nearly bit-exact (the fixtures: 0 to 0.16); one whose
// summation order differs is an independent sample of the bf16 noise, about
// as far as the F32 run or up to √2 times it (the released sizes on either
// backend: 0.85).
const sharedRounding = 0.25

// divergenceRow is the row of a free run that first left the reference's
// trace at first (nil: never), against forced, the first miss of the
// teacher-forced run of the same inputs (divergenceRule).
func divergenceRow(stage string, first, forced *Miss, n int, bound float64) Row {
	row := Row{Stage: stage, Bound: fmt.Sprintf("at the teacher-forced run's first miss, ≤ %.3g ulps", bound), OK: divergenceRule(first, forced, bound)}
	switch {
	case first == nil:
		row.Value = fmt.Sprintf("the reference's trace, all %d picks", n)
	case first.Ours < 0:
		row.Value = fmt.Sprintf("stopped at step %d of the reference's trace", first.Step)
	default:
		row.Value = fmt.Sprintf("the reference's trace up to step %d, then %.3g ulps", first.Step, first.Ulps())
		row.Detail = []string{"first divergence " + first.String()}
	}
	if forced != nil && (first == nil || !samePick(*first, *forced)) {
		row.Detail = append(row.Detail, "the teacher-forced run's first miss "+forced.String())
	}
	return row
}

// endToEnd checks the engine's own runs, whose backbone sees its own front
// end's audio rows: an independent sample of the bf16 noise (see
// stageRun), at most about √2 times as far from the reference as the F32
// engine run, which carries the reference's noise alone. Its shifts' rms
// is held to noiseRule; a miss, teacher-forced or free-running, is allowed
// where the reference won by at most √2 times the largest shift of the F32
// run (noiseBound).
func (c *comparer) endToEnd() {
	if !c.ref.Has("step_modality") {
		return
	}
	bf, f32 := newRecorded(c.bf), newRecorded(c.f32)
	c.record("engine bf16", bf)
	c.record("engine f32", f32)
	ms, n := c.misses(bf, true, true, false)
	m32, _ := c.misses(f32, true, true, false)
	z, z32 := c.noise("engine bf16", true, true), c.noise("engine f32", true, true)
	bound := noiseBound(z32)
	row := Row{Stage: "picks through the engine (teacher-forced)",
		Value: fmt.Sprintf("%d/%d agree%s (f32 run %d/%d)%s", n-len(ms), n, worst(ms), n-len(m32), n, shifts(z, z32)),
		Bound: fmt.Sprintf("shift rms ≤ √2× the f32 run's %.3g; each miss ≤ %.3g ulps (√2× the f32 run's largest shift, ≥ %d)", z32.rms, bound, loopUlps)}
	row.OK = n > 0 && withinAll(ms, bound) && noiseRule(z, z32)
	row.Detail = details(ms)
	c.rep.add(row)
	if !greedy(c.ref.Gen.Text) || !greedy(c.ref.Gen.Audio) {
		return
	}
	free := newRecorded(c.free)
	fm, fn := c.misses(free, true, true, true)
	var first, forced *Miss
	if len(fm) > 0 {
		first = &fm[0]
	}
	if first == nil && len(free.mod) < len(c.trace()) {
		first = &Miss{Step: len(free.mod), Codebook: -1, Ours: -1, Ref: -1, RefMargin: math.NaN(), RefTop: math.NaN()}
	}
	if len(ms) > 0 {
		forced = &ms[0]
	}
	c.rep.add(divergenceRow("free-running greedy through the engine", first, forced, fn, bound))
}

// trace returns the reference's step modalities.
func (c *comparer) trace() []int {
	mod, _ := c.ref.Ints("step_modality")
	return mod
}

// greedy reports whether a reference's sampling description is greedy.
func greedy(s string) bool { return s == "" || s == "greedy" }

func details(ms []Miss) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.String())
	}
	return out
}

// worst describes the largest reference margin among misses.
func worst(misses []Miss) string {
	if len(misses) == 0 {
		return ""
	}
	w := 0.0
	for _, m := range misses {
		if math.IsNaN(m.Ulps()) {
			return "; a miss of unknown margin"
		}
		w = math.Max(w, m.Ulps())
	}
	return fmt.Sprintf("; misses within %.3g ulps", w)
}

// depthOnReferenceStates feeds the reference's own backbone row of every
// audio step to the depthformer (the reference's codes fed back within the
// frame) and compares the greedy codes.
func (c *comparer) depthOnReferenceStates(m *lfm2audio.Model, dev gpu.Device) error {
	mod, err := c.ref.Ints("step_modality")
	if err != nil {
		return nil
	}
	hidden, _ := c.ref.Floats("step_hidden")
	codes, _ := c.ref.Ints("step_codes")
	margins, _ := c.ref.Floats("step_audio_margin")
	H, CB := m.Cfg.LFM.HiddenSize, m.Cfg.Codebooks
	var misses []Miss
	n, differ, stored := 0, 0, 0
	q := dev.NewQueue("parity")
	for s, md := range mod {
		if md != 3 || codes[s*CB] == m.Special.EOA {
			continue
		}
		ctx := nn.NewCtx(dev, q, nn.BF16)
		h := ctx.Tmp(1, H)
		ctx.Q.Write(h, hidden[s*H:(s+1)*H])
		_, err = m.Depth.Frame(ctx, h, func(_, i int, l []float32) int {
			n++
			ref := codes[s*CB+i]
			st := c.stored(s, i, len(l))
			if pick := numcmp.Argmax(l); pick != ref {
				misses = append(misses, newMiss(s, i, pick, ref, float64(margins[s*CB+i]), l, st))
			}
			if len(st) == len(l) {
				stored += len(l)
				for j := range l {
					if math.Float32bits(l[j]) != math.Float32bits(st[j]) {
						differ++
					}
				}
			}
			return ref // teacher-forced within the frame
		})
		ctx.A.Free()
		if err != nil {
			return fmt.Errorf("depthformer on the reference's states: %w", err)
		}
	}
	c.rep.add(Row{Stage: "depthformer greedy (reference states)",
		Value:  fmt.Sprintf("%d/%d agree%s; stored logits: %d of %d differ bit for bit", n-len(misses), n, worst(misses), differ, stored),
		Bound:  fmt.Sprintf("each miss ≤ %d ulps", depthUlps),
		OK:     depthRule(misses) && n > 0,
		Detail: details(misses)})
	return nil
}

func (c *comparer) codec(ctx context.Context, m *lfm2audio.Model) error {
	if m.Codec.Kind() != lfm2audio.CodecMimi {
		return nil // the reference waveforms are Mimi's
	}
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
