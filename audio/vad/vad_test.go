package vad

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

const rate = 16000

// seg is a piece of a synthetic signal.
type seg struct {
	dur   time.Duration
	tone  float64 // dBFS RMS of a 440 Hz sine; 0: none
	noise float64 // dBFS RMS of white noise; 0: none
}

// synth renders segments, deterministically.
func synth(segs ...seg) []float32 {
	r := rand.New(rand.NewPCG(1, 2))
	var out []float32
	n := 0
	for _, s := range segs {
		a := 0.0
		if s.tone != 0 {
			a = math.Sqrt2 * math.Pow(10, s.tone/20)
		}
		sd := 0.0
		if s.noise != 0 {
			sd = math.Pow(10, s.noise/20)
		}
		for range samplesOf(s.dur) {
			v := a*math.Sin(2*math.Pi*440*float64(n)/rate) + sd*r.NormFloat64()
			out = append(out, float32(v))
			n++
		}
	}
	return out
}

func samplesOf(d time.Duration) int { return int(d * rate / time.Second) }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// run feeds x in chunks of the given size and flushes at the end.
func run(t *testing.T, cfg Config, x []float32, chunk int) []Event {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for i := 0; i < len(x); i += chunk {
		evs = append(evs, d.Write(x[i:min(i+chunk, len(x))])...)
	}
	return append(evs, d.Flush()...)
}

// span is an expected utterance, in seconds from the stream start.
type span struct {
	start, end float64
	forced     bool
}

func TestSynthetic(t *testing.T) {
	base := Config{SampleRate: rate}
	quiet := -60.0 // background noise, dBFS
	tests := []struct {
		name  string
		cfg   Config
		boost float64
		x     []float32
		want  []span
	}{
		{"digital silence", base, 0, synth(seg{dur: 3 * time.Second}), nil},
		{"steady noise", base, 0, synth(seg{dur: 5 * time.Second, noise: -45}), nil},
		// A device that starts (or stays muted) with exact zeros: they do
		// not pull the floor down, so the room's noise is not speech.
		{"noise after digital silence", base, 0, synth(seg{dur: 6 * time.Second}, seg{dur: 5 * time.Second, noise: -45}), nil},
		// ... also when the noise begins inside a frame.
		{"noise after digital silence, mid-frame", base, 0, synth(seg{dur: 6*time.Second + ms(9) + 900*time.Microsecond}, seg{dur: 5 * time.Second, noise: -45}), nil},
		{"noise after a short drop-out", base, 0, synth(seg{dur: 3 * time.Second, noise: -45}, seg{dur: ms(23)}, seg{dur: 5 * time.Second, noise: -45}), nil},
		{"voice after digital silence", base, 0, synth(seg{dur: 6 * time.Second}, seg{dur: time.Second, noise: -50},
			seg{dur: time.Second, tone: -25, noise: -50}, seg{dur: 2 * time.Second, noise: -50}), []span{{7, 8, false}}},
		{"fluctuating noise", base, 0, synth(
			seg{dur: ms(700), noise: -50}, seg{dur: ms(60), noise: -42}, seg{dur: ms(900), noise: -50},
			seg{dur: ms(80), noise: -40}, seg{dur: time.Second, noise: -50}), nil},
		{"tone burst", base, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: time.Second, tone: -20, noise: quiet},
			seg{dur: 2 * time.Second, noise: quiet}), []span{{1, 2, false}}},
		{"burst at the start", base, 0, synth(
			seg{dur: ms(800), tone: -25}, seg{dur: 2 * time.Second, noise: quiet}), []span{{0, 0.8, false}}},
		{"click shorter than MinSpeech", base, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: ms(60), tone: -10, noise: quiet},
			seg{dur: 2 * time.Second, noise: quiet}), nil},
		{"short pause inside speech", base, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: ms(500), tone: -20, noise: quiet},
			seg{dur: ms(400), noise: quiet}, seg{dur: ms(500), tone: -20, noise: quiet},
			seg{dur: 2 * time.Second, noise: quiet}), []span{{1, 2.4, false}}},
		{"pause longer than MinSilence", base, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: ms(500), tone: -20, noise: quiet},
			seg{dur: ms(1000), noise: quiet}, seg{dur: ms(500), tone: -20, noise: quiet},
			seg{dur: 2 * time.Second, noise: quiet}), []span{{1, 1.5, false}, {2.5, 3, false}}},
		{"quiet voice, 20 dB over the noise", base, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: time.Second, tone: -40, noise: quiet},
			seg{dur: 2 * time.Second, noise: quiet}), []span{{1, 2, false}}},
		{"quiet voice under a 10 dB boost", base, 10, synth( // see TestBoost for SetBoost itself
			seg{dur: time.Second, noise: quiet}, seg{dur: time.Second, tone: -40, noise: quiet},
			seg{dur: 2 * time.Second, noise: quiet}), nil},
		{"speech running into the end", base, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: time.Second, tone: -20, noise: quiet}),
			[]span{{1, 2, true}}},
		{"MaxSpeech cuts", Config{SampleRate: rate, MaxSpeech: time.Second}, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: ms(1500), tone: -20, noise: quiet},
			seg{dur: 2 * time.Second, noise: quiet}), []span{{1, 2, true}, {2, 2.5, false}}},
		{"sustained noise becomes the floor", base, 0, synth(
			seg{dur: time.Second, noise: quiet}, seg{dur: 9 * time.Second, noise: -30}),
			// One FloorWindow after the noise's onset the quiet frames
			// leave the window; the floor's 250 ms mean of the onset
			// crosses noise-StopDB within a few frames, and the utterance
			// ends there. Nothing follows.
			[]span{{1, 1 + 4, false}}},
	}
	frame := DefaultFrame.Seconds()
	// The level is a mean over Smooth: after a burst ends it stays above
	// the threshold for less than Smooth; a frame is the time resolution.
	smooth := DefaultSmooth.Seconds()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ref []Event
			for _, chunk := range []int{1, 37, 160, 320, 4096} {
				cfg := tt.cfg
				d, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				d.SetBoost(tt.boost)
				var evs []Event
				for i := 0; i < len(tt.x); i += chunk {
					evs = append(evs, d.Write(tt.x[i:min(i+chunk, len(tt.x))])...)
				}
				evs = append(evs, d.Flush()...)
				if ref == nil {
					ref = evs
					checkWellFormed(t, evs, tt.x, d.Config())
				} else if !sameEvents(evs, ref) {
					t.Fatalf("chunks of %d: events differ from chunks of 1", chunk)
				}
			}
			got := spans(ref)
			t.Logf("utterances: %v", got)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d utterances %v, want %d %v", len(got), got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				g := got[i]
				lateEnd := smooth
				if strings.Contains(tt.name, "sustained") {
					lateEnd = 0.1 // "a few frames", generously
				}
				if g.start < w.start-1e-9 || g.start > w.start+frame+1e-9 {
					t.Errorf("utterance %d starts at %.3f s, want %.3f s (+%.2f)", i, g.start, w.start, frame)
				}
				if g.end < w.end-1e-9 || g.end > w.end+lateEnd+1e-9 {
					t.Errorf("utterance %d ends at %.3f s, want %.3f s (+%.2f)", i, g.end, w.end, lateEnd)
				}
				if g.forced != w.forced {
					t.Errorf("utterance %d forced %v, want %v", i, g.forced, w.forced)
				}
			}
		})
	}
}

func spans(evs []Event) []span {
	var out []span
	var start int64
	for _, e := range evs {
		switch e.Kind {
		case Start:
			start = e.At
		case End:
			out = append(out, span{float64(start) / rate, float64(e.At) / rate, e.Forced})
		}
	}
	return out
}

func sameEvents(a, b []Event) bool {
	return slices.EqualFunc(a, b, func(x, y Event) bool {
		return x.Kind == y.Kind && x.At == y.At && x.AudioStart == y.AudioStart && x.Forced == y.Forced &&
			slices.EqualFunc(x.Audio, y.Audio, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) })
	})
}

// checkWellFormed: Start and End alternate, time runs forward, and every
// utterance's audio is the input from PreRoll before its onset (or the
// oldest sample kept) to PostRoll after its end, bit for bit.
func checkWellFormed(t *testing.T, evs []Event, x []float32, cfg Config) {
	t.Helper()
	pre := int64(samplesOf(cfg.PreRoll))
	post := int64(samplesOf(cfg.PostRoll))
	var start int64 = -1
	var last int64
	for i, e := range evs {
		if e.At < last {
			t.Fatalf("event %d (%v) at %d before the previous one at %d", i, e.Kind, e.At, last)
		}
		last = e.At
		switch e.Kind {
		case Start:
			if start >= 0 {
				t.Fatalf("event %d: Start while speaking", i)
			}
			start = e.At
		case End:
			if start < 0 {
				t.Fatalf("event %d: End without Start", i)
			}
			if e.AudioStart > start-min(pre, start) && e.AudioStart != start-pre {
				// AudioStart may be later than start-pre only when the
				// previous utterance's audio was handed out just before.
				if i < 2 || evs[i-2].Kind != End {
					t.Errorf("utterance at %d: audio starts at %d, want %d (PreRoll)", start, e.AudioStart, start-pre)
				}
			}
			// A forced end may come before PostRoll has been written.
			got := e.AudioStart + int64(len(e.Audio))
			if want := e.At + post; got != want && !(e.Forced && got >= e.At && got < want) {
				t.Errorf("utterance at %d: audio ends at %d, want %d (PostRoll after %d)", start, got, want, e.At)
			}
			if !slices.Equal(e.Audio, x[e.AudioStart:e.AudioStart+int64(len(e.Audio))]) {
				t.Errorf("utterance at %d: audio differs from the input", start)
			}
			start = -1
		default:
			t.Fatalf("event %d: kind %v", i, e.Kind)
		}
	}
	if start >= 0 {
		t.Fatal("stream ended while speaking: Flush must close the utterance")
	}
}

func TestPreRollKeepsFirstSyllable(t *testing.T) {
	x := synth(seg{dur: 2 * time.Second, noise: -60}, seg{dur: time.Second, tone: -20, noise: -60}, seg{dur: 2 * time.Second, noise: -60})
	evs := run(t, Config{SampleRate: rate}, x, 320)
	if len(evs) != 2 {
		t.Fatalf("got %d events, want 2", len(evs))
	}
	e := evs[1]
	onset := int64(samplesOf(2 * time.Second))
	if want := onset - int64(samplesOf(DefaultPreRoll)); e.AudioStart != want {
		t.Errorf("audio starts at sample %d, want %d (300 ms before the onset at %d)", e.AudioStart, want, onset)
	}
	if !slices.Equal(e.Audio, x[e.AudioStart:e.AudioStart+int64(len(e.Audio))]) {
		t.Error("utterance audio differs from the input")
	}
	// The whole burst is inside the utterance.
	if end := e.AudioStart + int64(len(e.Audio)); end < onset+int64(samplesOf(time.Second)) {
		t.Errorf("utterance ends at %d, before the burst's end", end)
	}
}

func TestBoost(t *testing.T) {
	x := synth(seg{dur: time.Second, noise: -60}, seg{dur: time.Second, tone: -40, noise: -60}, seg{dur: time.Second, noise: -60})
	for _, tt := range []struct {
		boost float64
		want  int
	}{{0, 2}, {3, 2}, {10, 0}, {math.NaN(), 2}, {-5, 2}} {
		d, _ := New(Config{SampleRate: rate})
		d.SetBoost(tt.boost)
		evs := append(d.Write(x), d.Flush()...)
		if len(evs) != tt.want {
			t.Errorf("boost %g dB: %d events, want %d (a tone 20 dB over the floor; start threshold 15 dB)", tt.boost, len(evs), tt.want)
		}
	}
}

func TestResetDropsUtterance(t *testing.T) {
	x := synth(seg{dur: time.Second, noise: -60}, seg{dur: ms(500), tone: -20, noise: -60})
	d, _ := New(Config{SampleRate: rate})
	evs := d.Write(x)
	if len(evs) != 1 || evs[0].Kind != Start || !d.Speaking() {
		t.Fatalf("want a Start and speaking, got %v speaking=%v", evs, d.Speaking())
	}
	if !d.Voiced() {
		t.Error("not voiced during the tone")
	}
	d.Write(synth(seg{dur: ms(100), noise: -60}))
	if !d.Speaking() || d.Voiced() {
		t.Errorf("100 ms after the tone: speaking %v (want true: a pause), voiced %v (want false)", d.Speaking(), d.Voiced())
	}
	d.Reset()
	if d.Speaking() {
		t.Fatal("still speaking after Reset")
	}
	// A new burst is a new onset; the floor was kept.
	evs = d.Write(synth(seg{dur: ms(300), tone: -20, noise: -60}, seg{dur: time.Second, noise: -60}))
	if len(evs) != 2 || evs[0].Kind != Start || evs[1].Kind != End {
		t.Fatalf("after Reset: got %v, want Start and End", kinds(evs))
	}
	if d.Floor() > -55 {
		t.Errorf("floor %.1f dBFS after Reset, want the noise's (about -60)", d.Floor())
	}
}

func kinds(evs []Event) []Kind {
	var k []Kind
	for _, e := range evs {
		k = append(k, e.Kind)
	}
	return k
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "SampleRate"},
		{Config{SampleRate: 500}, "SampleRate"},
		{Config{SampleRate: rate, Frame: time.Microsecond}, "Frame"},
		{Config{SampleRate: rate, StartDB: -3}, "StartDB"},
		{Config{SampleRate: rate, StartDB: 6, StopDB: 9}, "StopDB"},
		{Config{SampleRate: rate, MinSilence: time.Millisecond}, "MinSilence"},
		{Config{SampleRate: rate, MinSilence: ms(100), PostRoll: ms(200)}, "PostRoll"},
		{Config{SampleRate: rate, MinSpeech: time.Second, MaxSpeech: time.Second}, "MaxSpeech"},
		{Config{SampleRate: rate, PreRoll: -time.Second}, "negative"},
		{Config{SampleRate: rate, MinFloorDB: 3}, "MinFloorDB"},
		{Config{SampleRate: rate, InitialFloorDB: -200}, "InitialFloorDB"},
		{Config{SampleRate: rate, FloorSmooth: time.Hour}, "FloorSmooth"},
		{Config{SampleRate: rate, StartDB: math.NaN()}, "StartDB"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
		if err2 := tt.cfg.Validate(); (err2 == nil) != (err == nil) {
			t.Errorf("Validate and New disagree: %v vs %v", err2, err)
		}
	}
	for _, r := range []int{8000, 16000, 22050, 44100, 48000} {
		if _, err := New(Config{SampleRate: r}); err != nil {
			t.Errorf("rate %d: %v", r, err)
		}
	}
}

// The fixture's spoken question: noise at about -50 dBFS, speech from
// 0.55 s to about 4.3 s. Followed by 2 s of its own leading noise and the
// question again, it is two utterances whose bounds match the signal's.
func TestFixtureSpeech(t *testing.T) {
	f, err := safetensors.Open("../../testdata/lfm2-audio-tiny/case1_question_16k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw, err := f.Lookup("input_wav")
	if err != nil {
		t.Fatal(err)
	}
	speech, err := tw.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	// The truth, from 10 ms frame levels: the leading 0.5 s is noise; its
	// loudest frame sets the line that speech frames cross.
	frameDB := func(x []float32, i int) float64 {
		var p float64
		for _, v := range x[i*160 : (i+1)*160] {
			p += float64(v) * float64(v)
		}
		return 10 * math.Log10(p/160+1e-10)
	}
	noiseMax := math.Inf(-1)
	for i := range 50 {
		noiseMax = max(noiseMax, frameDB(speech, i))
	}
	line := noiseMax + 3
	first, last := -1, -1
	for i := range len(speech) / 160 {
		if frameDB(speech, i) > line {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	t.Logf("noise max %.1f dBFS; frames above %.1f dBFS: %.2f s to %.2f s", noiseMax, line, float64(first)/100, float64(last+1)/100)

	x := append([]float32(nil), speech...)
	for range 4 {
		x = append(x, speech[:8000]...)
	}
	gap := len(x)
	x = append(x, speech...)
	x = append(x, speech[:8000]...)
	x = append(x, speech[:8000]...)
	evs := run(t, Config{SampleRate: rate}, x, 320)
	checkWellFormed(t, evs, x, Config{SampleRate: rate, PreRoll: DefaultPreRoll, PostRoll: DefaultPostRoll})
	got := spans(evs)
	t.Logf("utterances: %v", got)
	if len(got) != 2 {
		t.Fatalf("got %d utterances, want 2", len(got))
	}
	for k, off := range []int{0, gap} {
		s, e := got[k].start*rate-float64(off), got[k].end*rate-float64(off)
		// Onset: the first frame over the line, or one frame either side
		// (the VAD's line is relative to its floor, not to the noise's
		// loudest frame). End: within 100 ms of the last frame over the
		// line (quiet trailing frames between the two lines).
		if math.Abs(s-float64(first*160)) > 160 {
			t.Errorf("utterance %d starts at %.3f s, want %.3f s ± 10 ms", k, s/rate, float64(first)/100)
		}
		if math.Abs(e-float64((last+1)*160)) > 1600 {
			t.Errorf("utterance %d ends at %.3f s, want %.3f s ± 100 ms", k, e/rate, float64(last+1)/100)
		}
		if got[k].forced {
			t.Errorf("utterance %d was forced", k)
		}
	}
}

// FuzzDetector: any input, in any two chunks, gives well-formed events,
// the same as one Write, and never panics.
func FuzzDetector(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0}, uint16(1))
	f.Add(pcmBytes(synth(seg{dur: ms(300), noise: -60}, seg{dur: ms(400), tone: -10}, seg{dur: ms(800)})), uint16(3000))
	f.Fuzz(func(t *testing.T, b []byte, split uint16) {
		x := make([]float32, len(b)/2)
		for i := range x {
			x[i] = float32(int16(uint16(b[2*i])|uint16(b[2*i+1])<<8)) / 32768
		}
		if len(x) > 0 && split%7 == 0 {
			x[int(split)%len(x)] = float32(math.NaN())
		}
		cfg := Config{SampleRate: 8000, MinSpeech: ms(20), MinSilence: ms(50), PostRoll: ms(20), PreRoll: ms(30), MaxSpeech: ms(400)}
		d1, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		one := append(d1.Write(x), d1.Flush()...)
		d2, _ := New(cfg)
		k := min(int(split), len(x))
		two := append(d2.Write(x[:k]), d2.Write(x[k:])...)
		two = append(two, d2.Flush()...)
		if !sameEvents(one, two) {
			t.Fatalf("split at %d: events differ", k)
		}
		var speaking bool
		var last int64
		for _, e := range one {
			if e.At < last || e.At > int64(len(x)) {
				t.Fatalf("event at %d out of order or past the end (%d)", e.At, len(x))
			}
			last = e.At
			if (e.Kind == Start) == speaking {
				t.Fatalf("%v while speaking=%v", e.Kind, speaking)
			}
			speaking = e.Kind == Start
			if e.Kind == End {
				for i, v := range e.Audio {
					if a := x[e.AudioStart+int64(i)]; a != v && !(a != a && v != v) {
						t.Fatalf("audio sample %d differs from the input", i)
					}
				}
			}
		}
	})
}

func pcmBytes(x []float32) []byte {
	b := make([]byte, 0, 2*len(x))
	for _, v := range x {
		s := int16(max(-32768, min(32767, math.Round(float64(v)*32768))))
		b = append(b, byte(s), byte(uint16(s)>>8))
	}
	return b
}
