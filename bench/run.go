package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// Options configure Run.
type Options struct {
	// Clip is the user's speech of every turn (required).
	Clip *audio.Clip
	// ClipSource describes it in the report.
	ClipSource string
	// Turns is the number of measured turns (default 1); Warmup turns run
	// before them and are not measured (the first turn pages the weights
	// in and sizes every scratch arena).
	Turns, Warmup int
	// MaxNewTokens is the number of backbone steps per turn (default 36:
	// six text steps, twelve audio frames, six text, twelve audio).
	MaxNewTokens int
	// AudioSampling picks the audio codes; the zero value is greedy, the
	// official default pipeline.DefaultAudio. Text is greedy, as the
	// official speech-to-speech examples.
	AudioSampling pipeline.Sampling
	// Seed seeds turn i's sampling with Seed + i.
	Seed uint64
	// AllowStop lets the model end its text (<|text_end|>), its turn
	// (<|im_end|>) or its speech (end-of-audio) as it picks them. By
	// default those entries are suppressed in the sampler (never picked),
	// as the reference speed measurement masked them, so every turn runs
	// exactly MaxNewTokens steps in the 6-text/12-audio schedule.
	AllowStop bool
	// Precision is the engine's activation rounding (default nn.BF16).
	Precision nn.Precision
	// Bandwidth is the machine's memory bandwidth; nil measures it.
	Bandwidth *Bandwidth
	// Progress, when set, receives a line per turn.
	Progress io.Writer
	// Weights says how the weights are held (memory-mapped files or read
	// into memory), for the report.
	Weights string
}

// Run runs turns of m (a model of any family) on dev through the engine, one at a time, each in a
// new conversation with the same clip, and reports where the time went.
func Run(ctx context.Context, m family.Model, dev gpu.Device, o Options) (*Report, error) {
	if o.Clip == nil || len(o.Clip.Samples) == 0 {
		return nil, errors.New("bench: no input clip")
	}
	if o.Turns <= 0 {
		o.Turns = 1
	}
	o.Warmup = max(o.Warmup, 0)
	if o.MaxNewTokens <= 0 {
		o.MaxNewTokens = 36
	}
	if o.Precision == 0 {
		o.Precision = nn.BF16
	}
	if err := o.AudioSampling.Validate(); err != nil {
		return nil, fmt.Errorf("bench: audio sampling: %w", err)
	}
	threads := runtime.NumCPU()
	if w, ok := dev.(interface{ Workers() int }); ok {
		threads = w.Workers()
	}
	bw := o.Bandwidth
	if bw == nil {
		b := DeviceBandwidth(dev, threads)
		bw = &b
	}
	r := newReport(m, dev, threads, o, *bw)

	tr := &pipeline.Trace{}
	eng := pipeline.New(m, dev, pipeline.Options{Precision: o.Precision, MaxTurns: 1, Trace: tr})
	defer eng.Close()
	r.Settings.LogMelOnDevice = eng.LogMelOnDevice()
	var acc accum
	for i := 0; i < o.Warmup+o.Turns; i++ {
		start := time.Now()
		res, tt, err := runTurn(ctx, eng, tr, o, i)
		if err != nil {
			return nil, fmt.Errorf("bench: turn %d: %w", i+1, err)
		}
		warm := i < o.Warmup
		if o.Progress != nil {
			label := fmt.Sprintf("turn %d/%d", i+1-o.Warmup, o.Turns)
			if warm {
				label = fmt.Sprintf("warm-up %d/%d", i+1, o.Warmup)
			}
			fmt.Fprintf(o.Progress, "%s: %d steps (%d text, %d audio), stop %s, %.1f s\n",
				label, res.Steps, res.TextSteps, res.AudioSteps, res.Stop, time.Since(start).Seconds())
		}
		if warm {
			continue
		}
		r.Turns = append(r.Turns, res)
		acc.add(tt)
	}
	r.summarise(&acc)
	r.Model.DeviceInfo = gpu.DescribeDevice(dev)
	return r, nil
}

// observer is the turn's Teacher: it learns each step's kind and, unless
// stops are allowed, replaces a stopping pick by the best other entry.
type observer struct {
	suppress   bool
	sp         family.Special // the model's stopping tokens and end-of-audio code
	mu         sync.Mutex
	kinds      map[int]pipeline.Kind
	suppressed int
}

var _ pipeline.Teacher = (*observer)(nil)

func (o *observer) Text(step, picked int, logits []float32) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kinds[step] = pipeline.TextStep
	if o.suppress && (picked == o.sp.IMEnd || picked == o.sp.TextEnd) {
		o.suppressed++
		return argmaxExcept(logits, o.sp.IMEnd, o.sp.TextEnd)
	}
	return picked
}

func (o *observer) AudioCode(step, _, picked int, logits []float32) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kinds[step] = pipeline.AudioStep
	if o.suppress && picked == o.sp.EOA {
		o.suppressed++
		return argmaxExcept(logits, o.sp.EOA)
	}
	return picked
}

// argmaxExcept returns the index of the largest logit other than skip's
// (the lowest index on ties).
func argmaxExcept(logits []float32, skip ...int) int {
	best := -1
	for i, v := range logits {
		if slices.Contains(skip, i) {
			continue
		}
		if best < 0 || v > logits[best] {
			best = i
		}
	}
	return best
}

// turnTimes is one turn's stage times in milliseconds.
type turnTimes struct {
	logmel, encoder []float64
	prefill         []float64
	text, audio     []float64 // backbone steps after the prefill
	depth, codec    []float64
	codecBusy       float64
	overlapBackbone float64 // codec time during backbone work
	overlapLoop     float64 // codec time during backbone or depthformer work
	loopWall        float64 // from the prefill's end to the loop's last interval's end
	loopBusy        float64 // backbone steps after the prefill plus depthformer frames
	loopSteps       int     // backbone steps after the prefill
	frames          int     // depthformer frames
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func runTurn(ctx context.Context, eng *pipeline.Engine, tr *pipeline.Trace, o Options, i int) (TurnResult, turnTimes, error) {
	sess := eng.NewSession()
	defer sess.Close()
	tr.Reset()
	// Stops are suppressed in the sampler (on the device too), not by a
	// teacher: a teacher would need every codebook's logits on the host.
	req := pipeline.Request{
		Audio: o.Clip, MaxNewTokens: o.MaxNewTokens, Seed: o.Seed + uint64(i),
		TextSampling: pipeline.DefaultText, AudioSampling: o.AudioSampling, SuppressStops: !o.AllowStop,
	}
	st, err := eng.Start(ctx, sess, req)
	if err != nil {
		return TurnResult{}, turnTimes{}, err
	}
	var done *pipeline.DoneEvent
	samples := 0
	for ev := range st.Events {
		switch ev := ev.(type) {
		case *pipeline.AudioEvent:
			// A lagging codec (the detokenizer) sends its first frame short
			// and the rest in a last event: count frames by samples.
			samples += len(ev.Samples)
		case *pipeline.DoneEvent:
			done = ev
		case *pipeline.ErrorEvent:
			return TurnResult{}, turnTimes{}, ev.Err
		}
	}
	if done == nil {
		return TurnResult{}, turnTimes{}, errors.New("the turn ended without a result")
	}
	tm := done.Timings
	decoded := samples / eng.Model().AudioCodec().FrameSamples()
	res := TurnResult{
		Steps: tm.Steps, Tokens: tm.Tokens, Frames: tm.Frames, DecodedFrames: decoded,
		PromptRows: tm.PromptRows, Stop: done.Stop.String(),
		FirstTextMs: ms(tm.FirstText), FirstAudioMs: ms(tm.FirstAudio), TotalMs: ms(tm.Total),
		AudioSeconds: tm.AudioSeconds, RTF: tm.RTF,
	}
	ivs := tr.Intervals()
	kinds := stepKinds(ivs)
	res.AudioSteps = len(kinds)
	res.TextSteps = tm.Steps - res.AudioSteps
	tt, err := analyse(ivs, kinds)
	return res, tt, err
}

// stepKinds returns the backbone steps whose output the depthformer
// sampled a frame from (the audio steps; the other steps after the
// prompt's are text steps), read from the depthformer's intervals.
func stepKinds(ivs []pipeline.Interval) map[int]pipeline.Kind {
	kinds := map[int]pipeline.Kind{}
	for _, iv := range ivs {
		if iv.Stage == pipeline.StageDepth {
			for _, s := range iv.Steps {
				kinds[s] = pipeline.AudioStep
			}
		}
	}
	return kinds
}

// analyse sorts one turn's intervals into stage times: a backbone
// interval is the step it names (step 0 the prefill, in one or more
// chunks, whose times add up), whose kind the observer saw.
func analyse(ivs []pipeline.Interval, kinds map[int]pipeline.Kind) (turnTimes, error) {
	sort.SliceStable(ivs, func(i, j int) bool { return ivs[i].Start.Before(ivs[j].Start) })
	var tt turnTimes
	var backbone, loop, codec []pipeline.Interval
	step := 0
	var prefillEnd, loopEnd time.Time
	for _, iv := range ivs {
		d := ms(iv.End.Sub(iv.Start))
		switch iv.Stage {
		case pipeline.StageFrontend:
			tt.logmel = append(tt.logmel, d)
		case pipeline.StageEncoder:
			tt.encoder = append(tt.encoder, d)
		case pipeline.StageBackbone:
			backbone = append(backbone, iv)
			if len(iv.Steps) > 0 {
				step = iv.Steps[0] // a chunked prefill is several intervals of step 0
			}
			switch {
			case step == 0 && len(tt.prefill) > 0:
				tt.prefill[0] += d // the prompt's next chunk
				prefillEnd = iv.End
			case step == 0:
				tt.prefill = append(tt.prefill, d)
				prefillEnd = iv.End
			case kinds[step] == pipeline.AudioStep:
				tt.audio = append(tt.audio, d)
			default:
				tt.text = append(tt.text, d)
			}
			if step > 0 {
				loop = append(loop, iv)
				tt.loopBusy += d
				tt.loopSteps++
			}
			step++
		case pipeline.StageDepth:
			tt.depth = append(tt.depth, d)
			loop = append(loop, iv)
			tt.loopBusy += d
			tt.frames++
		case pipeline.StageCodec:
			tt.codec = append(tt.codec, d)
			codec = append(codec, iv)
			tt.codecBusy += d
		}
		if (iv.Stage == pipeline.StageBackbone && step > 1) || iv.Stage == pipeline.StageDepth {
			if iv.End.After(loopEnd) {
				loopEnd = iv.End
			}
		}
	}
	if len(tt.prefill) == 0 {
		return tt, errors.New("the trace holds no backbone step")
	}
	if !loopEnd.IsZero() {
		tt.loopWall = ms(loopEnd.Sub(prefillEnd))
	}
	for _, c := range codec {
		tt.overlapBackbone += overlap(c, backbone)
		tt.overlapLoop += overlap(c, append(slices.Clone(backbone), loop...))
	}
	return tt, nil
}

// overlap returns the milliseconds of c that fall inside the union of ivs.
func overlap(c pipeline.Interval, ivs []pipeline.Interval) float64 {
	var parts [][2]time.Time
	for _, iv := range ivs {
		s, e := iv.Start, iv.End
		if s.Before(c.Start) {
			s = c.Start
		}
		if e.After(c.End) {
			e = c.End
		}
		if e.After(s) {
			parts = append(parts, [2]time.Time{s, e})
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i][0].Before(parts[j][0]) })
	var total time.Duration
	var cur [2]time.Time
	for i, p := range parts {
		switch {
		case i == 0:
			cur = p
		case !p[0].After(cur[1]):
			if p[1].After(cur[1]) {
				cur[1] = p[1]
			}
		default:
			total += cur[1].Sub(cur[0])
			cur = p
		}
	}
	if len(parts) > 0 {
		total += cur[1].Sub(cur[0])
	}
	return ms(total)
}

// accum gathers the measured turns' times.
type accum struct {
	all []turnTimes
}

func (a *accum) add(t turnTimes) { a.all = append(a.all, t) }

func (a *accum) samples(f func(*turnTimes) []float64) []float64 {
	var out []float64
	for i := range a.all {
		out = append(out, f(&a.all[i])...)
	}
	return out
}

func (a *accum) sum(f func(*turnTimes) float64) float64 {
	s := 0.0
	for i := range a.all {
		s += f(&a.all[i])
	}
	return s
}

// quantile returns the nearest-rank q-quantile of v (0 when empty).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
