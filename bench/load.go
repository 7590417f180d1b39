package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// JitterBuffer is the playback buffer of the load generator's listener: it
// starts playing 160 ms after a turn's first audio arrives and, when it
// runs dry (an underrun: what a listener hears as a stall), waits for
// 160 ms of audio again.
const JitterBuffer = 160 * time.Millisecond

// LoadOptions configure a load run.
type LoadOptions struct {
	// Sessions is the number of concurrent turns, each in its own
	// conversation with its own input clip.
	Sessions int
	// ClipSeconds is each synthetic input clip's length (default 4.9 s).
	ClipSeconds float64
	// MaxNewTokens is each turn's backbone steps (default 36).
	MaxNewTokens int
	// Seed is the first session's clip and sampling seed (session i: Seed+i).
	Seed uint64
	// Ramp spreads the sessions' starts evenly over this long (session i
	// starts at i·Ramp/Sessions): a steady arrival of conversations instead
	// of all of them at once (0). First audio is from each session's own
	// start either way.
	Ramp time.Duration
	// Progress, when set, receives a line per finished run.
	Progress io.Writer
	// Trace, when set, is the in-process engine's trace (its
	// Options.Trace): each run resets it, keeps its intervals in
	// LoadReport.Intervals and summarises them in LoadReport.Trace.
	Trace *pipeline.Trace
}

func (o *LoadOptions) defaults() {
	if o.ClipSeconds <= 0 {
		o.ClipSeconds = 4.9
	}
	if o.MaxNewTokens <= 0 {
		o.MaxNewTokens = 36
	}
}

// Target runs the load's turns: an engine in this process or a server.
type Target interface {
	// Name describes the target ("in-process engine", a URL).
	Name() string
	// Turn runs one turn of a new conversation and calls audio for each
	// piece of speech as it arrives (samples at rate Hz).
	Turn(ctx context.Context, clip *audio.Clip, seed uint64, maxNew int, audio func(samples, rate int)) error
	// Memory returns the target's memory in use and its budget in bytes,
	// or false when it does not say.
	Memory(ctx context.Context) (used, budget int64, ok bool)
}

// SessionResult is one session of a load run. Times are from the run's
// start, in milliseconds.
type SessionResult struct {
	Index        int     `json:"index"`
	StartMS      float64 `json:"start_ms"`
	FirstAudioMS float64 `json:"first_audio_ms"` // from the session's start; 0: none
	EndMS        float64 `json:"end_ms"`
	AudioSeconds float64 `json:"audio_seconds"`
	RTF          float64 `json:"real_time_factor"` // turn time / audio seconds
	Chunks       int     `json:"chunks"`
	Underruns    int     `json:"underruns"`
	StallMS      float64 `json:"stall_ms"`
	GapP50MS     float64 `json:"gap_p50_ms"`
	GapP99MS     float64 `json:"gap_p99_ms"`
	Error        string  `json:"error,omitempty"`
	// UnderrunAtMS are when the buffer ran dry (from the run's start).
	UnderrunAtMS []float64 `json:"underrun_at_ms,omitempty"`
}

// LoadReport is one load run of N concurrent sessions.
type LoadReport struct {
	Target          string  `json:"target"`
	Sessions        int     `json:"sessions"`
	MaxNewTokens    int     `json:"max_new_tokens"`
	WallSeconds     float64 `json:"wall_seconds"`
	AudioPerSecond  float64 `json:"audio_seconds_per_second"` // all sessions' speech over the wall time
	FirstAudioP50MS float64 `json:"first_audio_p50_ms"`
	FirstAudioP99MS float64 `json:"first_audio_p99_ms"`
	RTFP50          float64 `json:"rtf_p50"`
	RTFMax          float64 `json:"rtf_max"`
	GapP50MS        float64 `json:"gap_p50_ms"` // over every session's chunk gaps
	GapP99MS        float64 `json:"gap_p99_ms"`
	Underruns       int     `json:"underruns"`
	// SessionsUnderrun counts the sessions that ran dry at least once.
	SessionsUnderrun int             `json:"sessions_with_underrun"`
	Failed           int             `json:"failed"`
	MemoryPeakBytes  int64           `json:"memory_peak_bytes,omitempty"`
	MemoryBudget     int64           `json:"memory_budget_bytes,omitempty"`
	PerSession       []SessionResult `json:"per_session"`
	// Trace says where the engine's time went in this run (with
	// LoadOptions.Trace); Intervals are the run's stage intervals.
	Trace     *TraceReport        `json:"trace,omitempty"`
	Intervals []pipeline.Interval `json:"-"`
}

// Load runs o.Sessions concurrent turns on tgt and measures what each
// listener gets.
func Load(ctx context.Context, tgt Target, o LoadOptions) (*LoadReport, error) {
	o.defaults()
	if o.Sessions < 1 {
		return nil, fmt.Errorf("load: %d sessions", o.Sessions)
	}
	if o.Ramp < 0 {
		return nil, fmt.Errorf("load: ramp %v", o.Ramp)
	}
	// The clips are made before the clock starts, on every core (at 256
	// sessions one after another they took 18 s).
	clips := make([]*audio.Clip, o.Sessions)
	errs := make([]error, o.Sessions)
	parallel(o.Sessions, func(i int) { clips[i], errs[i] = SpeechClip(o.ClipSeconds, 16000, o.Seed+uint64(i)) })
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	rep := &LoadReport{Target: tgt.Name(), Sessions: o.Sessions, MaxNewTokens: o.MaxNewTokens, PerSession: make([]SessionResult, o.Sessions)}
	stopMem := make(chan struct{})
	memDone := make(chan struct{})
	var memMu sync.Mutex
	sampleMem := func() {
		if used, budget, ok := tgt.Memory(ctx); ok {
			memMu.Lock()
			rep.MemoryPeakBytes, rep.MemoryBudget = max(rep.MemoryPeakBytes, used), budget
			memMu.Unlock()
		}
	}
	go func() { // sample the memory in use while the sessions run
		defer close(memDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			sampleMem()
			select {
			case <-stopMem:
				return
			case <-tick.C:
			}
		}
	}()
	if o.Trace != nil {
		o.Trace.Reset() // this run's intervals only
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range o.Sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepUntil(ctx, start.Add(o.Ramp*time.Duration(i)/time.Duration(o.Sessions))) {
				rep.PerSession[i] = SessionResult{Index: i, Error: ctx.Err().Error()}
				return
			}
			// Each session also samples at its first audio, when its turn
			// surely holds its memory (a turn shorter than the ticker's
			// period would otherwise go unseen).
			rep.PerSession[i] = runSession(ctx, tgt, start, i, clips[i], o, sampleMem)
		}()
	}
	wg.Wait()
	close(stopMem)
	<-memDone
	rep.WallSeconds = time.Since(start).Seconds()
	rep.summarise()
	if o.Trace != nil {
		rep.Intervals = o.Trace.Intervals()
		sum := AnalyseTrace(rep.Intervals)
		rep.Trace = &sum
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "%d sessions: %.1f s, %.2f s of audio per second, %d with an underrun, %d failed\n",
			o.Sessions, rep.WallSeconds, rep.AudioPerSecond, rep.SessionsUnderrun, rep.Failed)
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	return rep, nil
}

// sleepUntil waits until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// LoadCurve runs Load once per session count.
func LoadCurve(ctx context.Context, tgt Target, sessions []int, o LoadOptions) ([]*LoadReport, error) {
	var out []*LoadReport
	for _, n := range sessions {
		o.Sessions = n
		r, err := Load(ctx, tgt, o)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Chunk is a piece of speech: when it arrived, since the session's start,
// and how long it plays.
type Chunk struct {
	At, Dur time.Duration
}

func runSession(ctx context.Context, tgt Target, runStart time.Time, i int, clip *audio.Clip, o LoadOptions, atFirstAudio func()) SessionResult {
	res := SessionResult{Index: i}
	start := time.Now()
	res.StartMS = ms(start.Sub(runStart))
	var chunks []Chunk
	err := tgt.Turn(ctx, clip, o.Seed+uint64(i), o.MaxNewTokens, func(samples, rate int) {
		if samples > 0 && rate > 0 {
			chunks = append(chunks, Chunk{At: time.Since(start), Dur: time.Duration(samples) * time.Second / time.Duration(rate)})
			if len(chunks) == 1 {
				atFirstAudio()
			}
		}
	})
	total := time.Since(start)
	res.EndMS = ms(time.Since(runStart))
	if err != nil {
		res.Error = err.Error()
	}
	res.Chunks = len(chunks)
	if len(chunks) == 0 {
		return res
	}
	res.FirstAudioMS = ms(chunks[0].At)
	var audioDur time.Duration
	var gaps []float64
	for k, c := range chunks {
		audioDur += c.Dur
		if k > 0 {
			gaps = append(gaps, ms(c.At-chunks[k-1].At))
		}
	}
	res.AudioSeconds = audioDur.Seconds()
	res.RTF = total.Seconds() / res.AudioSeconds
	res.GapP50MS, res.GapP99MS = quantile(gaps, 0.5), quantile(gaps, 0.99)
	for _, u := range Underruns(chunks, JitterBuffer) {
		res.Underruns++
		res.StallMS += ms(u.Stall)
		res.UnderrunAtMS = append(res.UnderrunAtMS, res.StartMS+ms(u.At))
	}
	return res
}

// Underrun is a stall of playback: At when the buffer ran dry, for Stall.
type Underrun struct{ At, Stall time.Duration }

// Underruns plays chunks through a jitter buffer of depth buf: playback
// starts buf after the first chunk arrives; a chunk that has not arrived
// when the one before it has played out is an underrun, after which
// playback waits buf again.
func Underruns(chunks []Chunk, buf time.Duration) []Underrun {
	if len(chunks) == 0 {
		return nil
	}
	var out []Underrun
	play := chunks[0].At + buf // when the next chunk starts playing
	for _, c := range chunks {
		if c.At > play { // dry: the listener hears silence until it refills
			resume := c.At + buf
			out = append(out, Underrun{At: play, Stall: resume - play})
			play = resume
		}
		play += c.Dur
	}
	return out
}

func (r *LoadReport) summarise() {
	var first, rtf, p50, p99 []float64
	var audioSec float64
	for _, s := range r.PerSession {
		if s.Error != "" {
			r.Failed++
		}
		if s.Chunks == 0 {
			continue
		}
		first = append(first, s.FirstAudioMS)
		rtf = append(rtf, s.RTF)
		p50 = append(p50, s.GapP50MS)
		p99 = append(p99, s.GapP99MS)
		audioSec += s.AudioSeconds
		r.Underruns += s.Underruns
		if s.Underruns > 0 {
			r.SessionsUnderrun++
		}
	}
	r.FirstAudioP50MS, r.FirstAudioP99MS = quantile(first, 0.5), quantile(first, 0.99)
	r.RTFP50 = quantile(rtf, 0.5)
	if len(rtf) > 0 {
		r.RTFMax = slices.Max(rtf)
	}
	// The sessions' median gap, and the 99th percentile of their p99s.
	r.GapP50MS, r.GapP99MS = quantile(p50, 0.5), quantile(p99, 0.99)
	if r.WallSeconds > 0 {
		r.AudioPerSecond = audioSec / r.WallSeconds
	}
}

// PrintLoad writes the reports as a table, one row per session count.
func PrintLoad(w io.Writer, reps []*LoadReport) error {
	if len(reps) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target: %s, %d steps per turn, %v jitter buffer\n", reps[0].Target, reps[0].MaxNewTokens, JitterBuffer)
	fmt.Fprintln(tw, "sessions\tfirst audio p50\tp99\tRTF p50\tmax\tchunk gap p50\tp99\tunderruns\tsessions dry\taudio s/s\tmemory peak\tfailed\t")
	for _, r := range reps {
		mem := "-"
		if r.MemoryPeakBytes > 0 {
			mem = fmt.Sprintf("%.1f MiB", float64(r.MemoryPeakBytes)/(1<<20))
		}
		fmt.Fprintf(tw, "%d\t%.0f ms\t%.0f ms\t%.2f\t%.2f\t%.0f ms\t%.0f ms\t%d\t%d/%d\t%.2f\t%s\t%d\t\n",
			r.Sessions, r.FirstAudioP50MS, r.FirstAudioP99MS, r.RTFP50, r.RTFMax, r.GapP50MS, r.GapP99MS,
			r.Underruns, r.SessionsUnderrun, r.Sessions, r.AudioPerSecond, mem, r.Failed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	best := 0
	for _, r := range reps {
		if r.SessionsUnderrun == 0 && r.Failed == 0 {
			best = max(best, r.Sessions)
		}
	}
	if _, err := fmt.Fprintf(w, "largest N without an underrun: %d\n", best); err != nil {
		return err
	}
	for _, r := range reps {
		if r.Trace == nil {
			continue
		}
		fmt.Fprintf(w, "\n%d sessions: ", r.Sessions)
		if err := PrintTrace(w, *r.Trace); err != nil {
			return err
		}
	}
	return nil
}

// WriteLoadSVG draws sessions against time for each report: a line per
// session from its start to its end, dark from its first audio, with a red
// mark at each underrun.
func WriteLoadSVG(w io.Writer, reps []*LoadReport) error {
	const width, rowH, top, panelGap = 900.0, 3.0, 20.0, 30.0
	height := top
	for _, r := range reps {
		height += float64(r.Sessions)*rowH + panelGap
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width+120, height)
	y := top
	for _, r := range reps {
		span := r.WallSeconds * 1000
		if span <= 0 {
			span = 1
		}
		x := func(msv float64) float64 { return 100 + msv/span*width }
		fmt.Fprintf(&b, `<text x="4" y="%.1f">N = %d</text>`+"\n", y+10, r.Sessions)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.1f s</text>`+"\n", x(span), y-4, r.WallSeconds)
		for k, s := range r.PerSession {
			yy := y + float64(k)*rowH + rowH/2
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bbb" stroke-width="%.1f"/>`+"\n", x(s.StartMS), yy, x(s.EndMS), yy, rowH*0.8)
			if s.FirstAudioMS > 0 {
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#246" stroke-width="%.1f"/>`+"\n", x(s.StartMS+s.FirstAudioMS), yy, x(s.EndMS), yy, rowH*0.8)
			}
			for _, u := range s.UnderrunAtMS {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="#d22"/>`+"\n", x(u), yy, rowH*0.7)
			}
		}
		y += float64(r.Sessions)*rowH + panelGap
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// EngineTarget runs the turns on an engine in this process. Unless
// allowStop, a turn's stops are suppressed (Request.SuppressStops, as Run
// does), so that every turn runs its steps.
func EngineTarget(e *pipeline.Engine, allowStop bool) Target {
	return &engineTarget{e: e, allowStop: allowStop}
}

type engineTarget struct {
	e         *pipeline.Engine
	allowStop bool
}

func (t *engineTarget) Name() string { return "in-process engine" }

func (t *engineTarget) Memory(context.Context) (int64, int64, bool) {
	m := t.e.Memory()
	return m.Used, m.Budget, true
}

func (t *engineTarget) Turn(ctx context.Context, clip *audio.Clip, seed uint64, maxNew int, sink func(samples, rate int)) error {
	s := t.e.NewSession()
	defer s.Close()
	// Stops are suppressed in the sampler (no teacher), so that frames
	// sample on the device where it can.
	req := pipeline.Request{Audio: clip, MaxNewTokens: maxNew, Seed: seed, AudioSampling: pipeline.DefaultAudio, SuppressStops: !t.allowStop}
	st, err := t.e.Start(ctx, s, req)
	if err != nil {
		return err
	}
	var fail error
	for ev := range st.Events {
		switch ev := ev.(type) {
		case *pipeline.AudioEvent:
			sink(len(ev.Samples), ev.Rate)
		case *pipeline.ErrorEvent:
			fail = ev.Err
		}
	}
	return fail
}

// HTTPTarget runs the turns against a server's POST /v1/audio/chat
// (server-sent events), at base (e.g. http://127.0.0.1:8080), with an
// optional bearer token.
func HTTPTarget(base, apiKey string, client *http.Client) Target {
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	}
	return &httpTarget{base: strings.TrimRight(base, "/"), key: apiKey, c: client}
}

type httpTarget struct {
	base, key string
	c         *http.Client
}

func (t *httpTarget) Name() string { return t.base }

func (t *httpTarget) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, t.base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if t.key != "" {
		req.Header.Set("Authorization", "Bearer "+t.key)
	}
	return t.c.Do(req)
}

// Memory reads /health's memory.
func (t *httpTarget) Memory(ctx context.Context) (int64, int64, bool) {
	resp, err := t.do(ctx, http.MethodGet, "/health", nil)
	if err != nil {
		return 0, 0, false
	}
	defer resp.Body.Close()
	var h struct {
		Memory *struct {
			Used   int64 `json:"used_bytes"`
			Budget int64 `json:"budget_bytes"`
		} `json:"memory"`
	}
	if json.NewDecoder(resp.Body).Decode(&h) != nil || h.Memory == nil {
		return 0, 0, false
	}
	return h.Memory.Used, h.Memory.Budget, true
}

// serverRate is the rate of /v1/audio/chat's PCM (24 kHz, as docs/api.md
// says).
const serverRate = 24000

func (t *httpTarget) Turn(ctx context.Context, clip *audio.Clip, seed uint64, maxNew int, sink func(samples, rate int)) error {
	var wav bytes.Buffer
	if err := audio.WriteWAV(&wav, clip.SampleRate, clip.Samples); err != nil {
		return err
	}
	body, err := json.Marshal(map[string]any{
		"audio": base64.StdEncoding.EncodeToString(wav.Bytes()), "max_new_tokens": maxNew,
		"seed": seed, "stream": true,
	})
	if err != nil {
		return err
	}
	resp, err := t.do(ctx, http.MethodPost, "/v1/audio/chat", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("POST /v1/audio/chat: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return readSSE(resp.Body, sink)
}

// readSSE reads /v1/audio/chat's events until done (nil) or error.
func readSSE(r io.Reader, sink func(samples, rate int)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	var event string
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0: // end of an event
			switch event {
			case "audio":
				var a struct {
					PCM string `json:"pcm"`
				}
				if err := json.Unmarshal(data, &a); err != nil {
					return fmt.Errorf("audio event: %w", err)
				}
				pcm, err := base64.StdEncoding.DecodeString(a.PCM)
				if err != nil {
					return fmt.Errorf("audio event: %w", err)
				}
				sink(len(pcm)/2, serverRate) // 16-bit samples
			case "done":
				return nil
			case "error":
				return fmt.Errorf("error event: %s", data)
			}
			event, data = "", data[:0]
		case bytes.HasPrefix(line, []byte("event:")):
			event = string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			data = append(data, bytes.TrimSpace(line[len("data:"):])...)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the stream ended without a done event")
}
