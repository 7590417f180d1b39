package bench

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// Report is what Run measured. Times are in milliseconds.
type Report struct {
	Model    ModelInfo    `json:"model"`
	Machine  Machine      `json:"machine"`
	Input    Input        `json:"input"`
	Settings Settings     `json:"settings"`
	Turns    []TurnResult `json:"turns"`
	// Stages holds, per stage, the distribution of its busy intervals over
	// the measured turns.
	Stages  []StageStat `json:"stages"`
	Summary Summary     `json:"summary"`
	Floors  Floors      `json:"floors"`
}

// ModelInfo describes the model that ran.
type ModelInfo struct {
	Name string `json:"name"`
	// Commit is the Hugging Face commit of a model that came by its repo
	// id (Name is then owner/name); empty for a folder.
	Commit string `json:"commit,omitempty"`
	Params int64  `json:"params"`
	// Family and Codec are the model's family (lfm2-audio, lfm2.5-audio)
	// and the codec that decoded its speech (mimi, detokenizer).
	Family string `json:"family,omitempty"`
	Codec  string `json:"codec,omitempty"`
	// Defaults are the family's default system prompts and its voices.
	Defaults  family.Defaults `json:"defaults"`
	Device    string          `json:"device"`
	Threads   int             `json:"threads"`
	Precision string          `json:"precision"`
	Weights   WeightBytes     `json:"loop_weight_bytes"`
	// Holding says how the weights are held (Options.Weights).
	Holding string `json:"weights_held,omitempty"`
	// DeviceInfo is the device's report at the end of the run (driver,
	// memory in use).
	DeviceInfo gpu.Info `json:"device_info"`
}

// Machine describes the host.
type Machine struct {
	CPU       string    `json:"cpu"`
	Cores     int       `json:"cores"`
	GOARCH    string    `json:"goarch"`
	Go        string    `json:"go"`
	Bandwidth Bandwidth `json:"bandwidth"`
}

// Input describes the user's turn.
type Input struct {
	Source     string  `json:"source"`
	Seconds    float64 `json:"seconds"`
	SampleRate int     `json:"sample_rate"`
}

// Settings are the run's options.
type Settings struct {
	Turns         int     `json:"turns"`
	Warmup        int     `json:"warmup"`
	MaxNewTokens  int     `json:"max_new_tokens"`
	Text          string  `json:"text_sampling"`
	Audio         string  `json:"audio_sampling"`
	Seed          uint64  `json:"seed"`
	StopsAllowed  bool    `json:"stops_allowed"`
	FrameMs       float64 `json:"frame_ms"`
	InterleaveTxt int     `json:"interleaved_n_text"`
	InterleaveAud int     `json:"interleaved_n_audio"`
	// LogMelOnDevice: the clips' features are computed on the device, in
	// the encoder's stage (the log-mel stage then times only the host's
	// checks and pre-emphasis).
	LogMelOnDevice bool `json:"logmel_on_device"`
}

// TurnResult is one measured turn.
type TurnResult struct {
	PromptRows    int     `json:"prompt_rows"`
	Steps         int     `json:"steps"`
	TextSteps     int     `json:"text_steps"`
	AudioSteps    int     `json:"audio_steps"`
	Tokens        int     `json:"tokens"`
	Frames        int     `json:"frames"`
	DecodedFrames int     `json:"decoded_frames"`
	Stop          string  `json:"stop"`
	FirstTextMs   float64 `json:"first_text_ms"`
	FirstAudioMs  float64 `json:"first_audio_ms"`
	TotalMs       float64 `json:"total_ms"`
	AudioSeconds  float64 `json:"audio_seconds"`
	RTF           float64 `json:"rtf"`
}

// StageStat is the distribution of one stage's intervals.
type StageStat struct {
	Stage  string  `json:"stage"`
	What   string  `json:"what"`
	N      int     `json:"n"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	Min    float64 `json:"min_ms"`
	Mean   float64 `json:"mean_ms"`
}

// Stage keys of Report.Stages.
const (
	KeyLogMel     = "logmel"
	KeyEncoder    = "encoder"
	KeyPrefill    = "prefill"
	KeyTextStep   = "backbone_text_step"
	KeyAudioStep  = "backbone_audio_step"
	KeyDepthFrame = "depthformer_frame"
	KeyCodecCall  = "codec_call"
)

// Summary holds the derived numbers.
type Summary struct {
	// LogMelPerSecond and EncoderPerSecond are each front-end stage's
	// median per second of input audio; FrontEndPerSecond their sum.
	LogMelPerSecond   float64 `json:"logmel_ms_per_audio_s"`
	EncoderPerSecond  float64 `json:"encoder_ms_per_audio_s"`
	FrontEndPerSecond float64 `json:"frontend_ms_per_audio_s"`
	// LoopPerFrame is an audio frame's compute: the median backbone audio
	// step plus the median depthformer frame; LoopRealTime is it over the
	// frame's duration (below 1: faster than real time).
	LoopPerFrame float64 `json:"loop_ms_per_frame"`
	LoopRealTime float64 `json:"loop_x_realtime"`
	// GenerationPerFrame is the loop's wall time from the prefill's end to
	// its last step, per audio frame: text steps, sampling and hand-offs
	// included.
	GenerationPerFrame float64 `json:"generation_ms_per_frame"`
	// HandoffPerStep is the loop's wall time outside any stage interval,
	// per step: sampling on the host, channel hand-offs, scheduling.
	HandoffPerStep float64 `json:"handoff_ms_per_step"`
	// CodecPerFrame is the codec's busy time per decoded frame.
	CodecPerFrame float64 `json:"codec_ms_per_frame"`
	// Medians over the measured turns.
	FirstText  float64 `json:"first_text_ms"`
	FirstAudio float64 `json:"first_audio_ms"`
	RTF        float64 `json:"rtf"`
	// CodecOverlapBackbone is the fraction of the codec's busy time during
	// which the backbone was busy too; CodecOverlapLoop counts backbone or
	// depthformer work.
	CodecOverlapBackbone float64 `json:"codec_overlap_backbone"`
	CodecOverlapLoop     float64 `json:"codec_overlap_loop"`
	// Achieved weight-read rates (GB/s): loop weight bytes over the median
	// step time.
	AudioStepGBs  float64 `json:"audio_step_gb_s"`
	TextStepGBs   float64 `json:"text_step_gb_s"`
	DepthFrameGBs float64 `json:"depth_frame_gb_s"`
}

// Floors are the loop's memory-bandwidth floors: weight bytes per step over
// the measured copy rate (and, lower, over the read rate).
type Floors struct {
	AudioStep      float64 `json:"audio_step_ms"`
	TextStep       float64 `json:"text_step_ms"`
	DepthFrame     float64 `json:"depth_frame_ms"`
	AudioFrame     float64 `json:"audio_frame_ms"`
	AudioFrameRead float64 `json:"audio_frame_read_ms"`
	// AudioFrameRealTime is AudioFrame over the frame's duration.
	AudioFrameRealTime float64 `json:"audio_frame_x_realtime"`
}

func newReport(m family.Model, dev gpu.Device, threads int, o Options, bw Bandwidth) *Report {
	info, codec := m.Info(), m.AudioCodec()
	var weights WeightBytes
	if lm, ok := m.(*lfm2audio.Model); ok {
		weights = ModelWeightBytes(lm)
	}
	r := &Report{
		Model: ModelInfo{Name: info.Name, Params: info.Params, Family: info.Family, Codec: codec.Kind(),
			Defaults: family.DefaultsOf(m.Template()), Device: dev.Name(), Threads: threads,
			Precision: o.Precision.String(), Weights: weights, Holding: o.Weights},
		Machine: Machine{CPU: cpuName(), Cores: runtime.NumCPU(), GOARCH: runtime.GOARCH, Go: runtime.Version(), Bandwidth: bw},
		Input: Input{Source: o.ClipSource, SampleRate: o.Clip.SampleRate,
			Seconds: float64(len(o.Clip.Samples)) / float64(o.Clip.SampleRate)},
		Settings: Settings{Turns: o.Turns, Warmup: o.Warmup, MaxNewTokens: o.MaxNewTokens,
			Text: "greedy", Audio: samplingString(o), Seed: o.Seed, StopsAllowed: o.AllowStop,
			FrameMs:       1000 * float64(codec.FrameSamples()) / float64(codec.SampleRate()),
			InterleaveTxt: info.InterleavedText, InterleaveAud: info.InterleavedAudio},
	}
	return r
}

// defaultsString spells a family's defaults on one line: the system
// prompt of each mode, then the voices.
func defaultsString(d family.Defaults) string {
	var b strings.Builder
	modes := slices.Sorted(maps.Keys(d.SystemPrompts))
	for i, mode := range modes {
		if i == 0 {
			b.WriteString("system prompt ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %q", mode, d.SystemPrompts[mode])
	}
	if b.Len() > 0 {
		b.WriteString("; ")
	}
	if len(d.Voices) == 0 {
		b.WriteString("no preset voices")
		return b.String()
	}
	b.WriteString("voices ")
	for i, v := range d.Voices {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v.Name)
	}
	return b.String()
}

func samplingString(o Options) string {
	s := o.AudioSampling
	if s.Greedy() {
		return "greedy"
	}
	out := fmt.Sprintf("temperature %g", s.Temperature)
	if s.TopK > 0 {
		out += fmt.Sprintf(", top-k %d", s.TopK)
	}
	if s.TopP > 0 && s.TopP < 1 {
		out += fmt.Sprintf(", top-p %g", s.TopP)
	}
	return out
}

func (r *Report) summarise(a *accum) {
	stat := func(key, what string, v []float64) StageStat {
		s := StageStat{Stage: key, What: what, N: len(v), Median: quantile(v, 0.5), P90: quantile(v, 0.9)}
		if len(v) > 0 {
			s.Min = quantile(v, 0)
			for _, x := range v {
				s.Mean += x
			}
			s.Mean /= float64(len(v))
		}
		return s
	}
	rows := 0
	if len(r.Turns) > 0 {
		rows = r.Turns[0].PromptRows
	}
	text := stat(KeyTextStep, "backbone text step (1 row + text head)", a.samples(func(t *turnTimes) []float64 { return t.text }))
	aud := stat(KeyAudioStep, "backbone audio step (1 row)", a.samples(func(t *turnTimes) []float64 { return t.audio }))
	dep := stat(KeyDepthFrame, "depthformer frame (all codebooks)", a.samples(func(t *turnTimes) []float64 { return t.depth }))
	melWhat, encWhat := "log-mel (clip)", "encoder + adapter (clip)"
	if r.Settings.LogMelOnDevice {
		melWhat, encWhat = "log-mel (clip; on the host: checks)", "log-mel on the GPU + encoder + adapter"
	}
	mel := stat(KeyLogMel, melWhat, a.samples(func(t *turnTimes) []float64 { return t.logmel }))
	enc := stat(KeyEncoder, encWhat, a.samples(func(t *turnTimes) []float64 { return t.encoder }))
	r.Stages = []StageStat{
		mel, enc,
		stat(KeyPrefill, fmt.Sprintf("prefill (%d rows + text head)", rows), a.samples(func(t *turnTimes) []float64 { return t.prefill })),
		text, aud, dep,
		stat(KeyCodecCall, "codec call", a.samples(func(t *turnTimes) []float64 { return t.codec })),
	}

	s := &r.Summary
	if sec := r.Input.Seconds; sec > 0 {
		s.LogMelPerSecond = mel.Median / sec
		s.EncoderPerSecond = enc.Median / sec
		s.FrontEndPerSecond = s.LogMelPerSecond + s.EncoderPerSecond
	}
	frame := r.Settings.FrameMs
	if aud.N > 0 && dep.N > 0 {
		s.LoopPerFrame = aud.Median + dep.Median
		s.LoopRealTime = s.LoopPerFrame / frame
	}
	frames := a.sum(func(t *turnTimes) float64 { return float64(t.frames) })
	if frames > 0 {
		s.GenerationPerFrame = a.sum(func(t *turnTimes) float64 { return t.loopWall }) / frames
	}
	if steps := a.sum(func(t *turnTimes) float64 { return float64(t.loopSteps) }); steps > 0 {
		s.HandoffPerStep = (a.sum(func(t *turnTimes) float64 { return t.loopWall }) - a.sum(func(t *turnTimes) float64 { return t.loopBusy })) / steps
	}
	decoded := 0
	for _, t := range r.Turns {
		decoded += t.DecodedFrames
	}
	busy := a.sum(func(t *turnTimes) float64 { return t.codecBusy })
	if decoded > 0 {
		s.CodecPerFrame = busy / float64(decoded)
	}
	if busy > 0 {
		s.CodecOverlapBackbone = a.sum(func(t *turnTimes) float64 { return t.overlapBackbone }) / busy
		s.CodecOverlapLoop = a.sum(func(t *turnTimes) float64 { return t.overlapLoop }) / busy
	}
	var ft, fa, rtf []float64
	for _, t := range r.Turns {
		if t.FirstTextMs > 0 {
			ft = append(ft, t.FirstTextMs)
		}
		if t.FirstAudioMs > 0 {
			fa = append(fa, t.FirstAudioMs)
		}
		if t.RTF > 0 {
			rtf = append(rtf, t.RTF)
		}
	}
	s.FirstText, s.FirstAudio, s.RTF = quantile(ft, 0.5), quantile(fa, 0.5), quantile(rtf, 0.5)
	w := r.Model.Weights
	gbs := func(bytes int64, msec float64) float64 {
		if msec <= 0 {
			return 0
		}
		return float64(bytes) / (msec / 1000) / 1e9
	}
	s.AudioStepGBs = gbs(w.Backbone, aud.Median)
	s.TextStepGBs = gbs(w.TextStep(), text.Median)
	s.DepthFrameGBs = gbs(w.DepthFrame, dep.Median)

	bw := r.Machine.Bandwidth
	floor := func(bytes int64, gbs float64) float64 {
		if gbs <= 0 {
			return 0
		}
		return float64(bytes) / (gbs * 1e9) * 1000
	}
	r.Floors = Floors{
		AudioStep:      floor(w.Backbone, bw.CopyGBs),
		TextStep:       floor(w.TextStep(), bw.CopyGBs),
		DepthFrame:     floor(w.DepthFrame, bw.CopyGBs),
		AudioFrame:     floor(w.AudioFrame(), bw.CopyGBs),
		AudioFrameRead: floor(w.AudioFrame(), bw.ReadGBs),
	}
	r.Floors.AudioFrameRealTime = r.Floors.AudioFrame / frame
}

// Stage returns the statistics of the stage with key, or false.
func (r *Report) Stage(key string) (StageStat, bool) {
	for _, s := range r.Stages {
		if s.Stage == key {
			return s, true
		}
	}
	return StageStat{}, false
}

// Print writes the report as text tables.
func (r *Report) Print(w io.Writer) error {
	bw := &errWriter{w: w}
	m, mc, in, st := r.Model, r.Machine, r.Input, r.Settings
	name := m.Name
	if m.Commit != "" {
		name += "@" + m.Commit
	}
	fmt.Fprintf(bw, "model      %s: %s parameters, precision %s, %s", name, count(m.Params), m.Precision, m.Device)
	if m.Codec != "" {
		fmt.Fprintf(bw, ", %s with codec %s", m.Family, m.Codec)
	}
	if m.Holding != "" {
		fmt.Fprintf(bw, ", weights %s", m.Holding)
	}
	fmt.Fprintln(bw)
	if d := m.Defaults; len(d.SystemPrompts) > 0 || len(d.Voices) > 0 {
		fmt.Fprintf(bw, "defaults   %s\n", defaultsString(d))
	}
	if mc.Bandwidth.Device != "" {
		fmt.Fprintf(bw, "machine    %s, %d cores, %s; device memory %.0f GB/s (copy, bytes read + written)\n",
			mc.CPU, mc.Cores, mc.Go, mc.Bandwidth.CopyGBs)
	} else {
		fmt.Fprintf(bw, "machine    %s, %d cores, %s; memcpy %.1f GB/s, read %.1f GB/s (%d threads)\n",
			mc.CPU, mc.Cores, mc.Go, mc.Bandwidth.CopyGBs, mc.Bandwidth.ReadGBs, mc.Bandwidth.Threads)
	}
	if m.DeviceInfo.Kind != "" {
		fmt.Fprintf(bw, "device     %s %s", m.DeviceInfo.Kind, m.DeviceInfo.Name)
		if m.DeviceInfo.Driver != "" {
			fmt.Fprintf(bw, ", %s", m.DeviceInfo.Driver)
		}
		fmt.Fprintf(bw, "; %sB in use", count(m.DeviceInfo.MemUsed))
		if m.DeviceInfo.MemTotal > 0 {
			fmt.Fprintf(bw, " of %sB", count(m.DeviceInfo.MemTotal))
		}
		fmt.Fprintln(bw)
	}
	fmt.Fprintf(bw, "input      %s: %.2f s at %d Hz\n", in.Source, in.Seconds, in.SampleRate)
	stops := "<|im_end|>, <|text_end|> and end-of-audio suppressed (never picked)"
	if st.StopsAllowed {
		stops = "the model may stop"
	}
	fmt.Fprintf(bw, "turns      %d measured after %d warm-up, up to %d steps each; text greedy, audio %s, seed %d; %s\n",
		st.Turns, st.Warmup, st.MaxNewTokens, st.Audio, st.Seed, stops)
	for i, t := range r.Turns {
		fmt.Fprintf(bw, "  turn %d   %d prompt rows, %d steps (%d text, %d audio), %d tokens, %d frames (%d decoded, %.2f s), stop %s\n",
			i+1, t.PromptRows, t.Steps, t.TextSteps, t.AudioSteps, t.Tokens, t.Frames, t.DecodedFrames, t.AudioSeconds, t.Stop)
	}
	fmt.Fprintln(bw)

	width := len("stage")
	for _, s := range r.Stages {
		width = max(width, len(s.What))
	}
	fmt.Fprintf(bw, "%-*s %5s %10s %10s %10s %10s\n", width, "stage", "n", "median ms", "p90 ms", "min ms", "mean ms")
	for _, s := range r.Stages {
		fmt.Fprintf(bw, "%-*s %5d %10s %10s %10s %10s\n", width, s.What, s.N, msString(s.Median), msString(s.P90), msString(s.Min), msString(s.Mean))
	}
	fmt.Fprintln(bw)

	s, f, wb := r.Summary, r.Floors, m.Weights
	fmt.Fprintf(bw, "front end          %.1f ms per second of input audio (log-mel %.1f, encoder %.1f)\n",
		s.FrontEndPerSecond, s.LogMelPerSecond, s.EncoderPerSecond)
	fmt.Fprintf(bw, "loop per frame     %.1f ms per %.0f ms frame (audio step + depthformer frame): %.2f× real time\n",
		s.LoopPerFrame, st.FrameMs, s.LoopRealTime)
	fmt.Fprintf(bw, "generation         %.1f ms of wall time per frame, text steps included; %.2f ms per step outside the stages\n",
		s.GenerationPerFrame, s.HandoffPerStep)
	fmt.Fprintf(bw, "codec              %.1f ms per frame; %.0f%% of its busy time overlapped the backbone (%.0f%% backbone or depthformer)\n",
		s.CodecPerFrame, 100*s.CodecOverlapBackbone, 100*s.CodecOverlapLoop)
	fmt.Fprintf(bw, "first text         %.0f ms    first audio %.0f ms    real-time factor %.2f (turn wall time / reply audio)\n",
		s.FirstText, s.FirstAudio, s.RTF)
	fmt.Fprintf(bw, "weights read       audio step %sB at %.1f GB/s, text step %sB at %.1f GB/s, depthformer frame %sB at %.1f GB/s\n",
		count(wb.Backbone), s.AudioStepGBs, count(wb.TextStep()), s.TextStepGBs, count(wb.DepthFrame), s.DepthFrameGBs)
	fmt.Fprintf(bw, "bandwidth floor    audio step %s ms, text step %s ms, depthformer frame %s ms, audio frame %s ms (%.2f× real time) at memcpy speed; %s ms at read speed\n",
		msString(f.AudioStep), msString(f.TextStep), msString(f.DepthFrame), msString(f.AudioFrame), f.AudioFrameRealTime, msString(f.AudioFrameRead))
	return bw.err
}

// msString formats milliseconds with three significant digits or more.
func msString(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

// count formats a count with an SI prefix: 1.45 G, 2.34 G, 812 k.
func count(n int64) string {
	v := float64(n)
	for _, p := range []struct {
		div    float64
		prefix string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= p.div {
			return fmt.Sprintf("%.3g %s", v/p.div, p.prefix)
		}
	}
	return fmt.Sprintf("%d ", n)
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// cpuName returns the CPU's model name (Linux), or the architecture.
func cpuName() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
