package device

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omni-pipe/omni-pipe/audio"
)

func ramp(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%1000) / 1000
	}
	return x
}

func TestFileSourceFast(t *testing.T) {
	defer goleak.VerifyNone(t)
	x := ramp(16000 + 123)
	for _, tt := range []struct {
		chunk time.Duration
		n     int // samples per chunk at 16 kHz
	}{{0, 320}, {10 * time.Millisecond, 160}, {time.Second / 16000, 1}, {2 * time.Second, 16123}} {
		s, err := NewClipSource(&audio.Clip{SampleRate: 16000, Samples: x}, FileOptions{Chunk: tt.chunk})
		if err != nil {
			t.Fatal(err)
		}
		var got []float32
		chunks := 0
		for c := range s.Chunks() {
			if len(c) > tt.n || (len(c) < tt.n && len(got)+len(c) != len(x)) {
				t.Fatalf("chunk %v: a chunk of %d samples, want %d (only the last may be shorter)", tt.chunk, len(c), tt.n)
			}
			got = append(got, c...)
			chunks++
		}
		if !slices.Equal(got, x) {
			t.Errorf("chunk %v: delivered %d samples that differ from the clip's %d", tt.chunk, len(got), len(x))
		}
		if want := (len(x) + tt.n - 1) / tt.n; chunks != want {
			t.Errorf("chunk %v: %d chunks, want %d", tt.chunk, chunks, want)
		}
		if s.Err() != nil || s.SampleRate() != 16000 {
			t.Errorf("Err %v, rate %d", s.Err(), s.SampleRate())
		}
		s.Close()
		s.Close() // idempotent
	}
}

// A real-time source never delivers a chunk before a microphone could have
// recorded it (a lower bound on time: it cannot fail on a slow machine).
func TestFileSourceRealtimeNotEarly(t *testing.T) {
	defer goleak.VerifyNone(t)
	x := ramp(8000 * 3 / 10) // 300 ms at 8 kHz
	s, err := NewClipSource(&audio.Clip{SampleRate: 8000, Samples: x}, FileOptions{Chunk: 50 * time.Millisecond, Realtime: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	n := 0
	for c := range s.Chunks() {
		n += len(c)
		if el, audio := time.Since(start), duration(int64(n), 8000); el < audio {
			t.Fatalf("%v of audio delivered after %v", audio, el)
		}
	}
	if n != len(x) {
		t.Fatalf("delivered %d samples, want %d", n, len(x))
	}
}

func TestFileSourceCloseStopsEarly(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, realtime := range []bool{false, true} {
		s, err := NewClipSource(&audio.Clip{SampleRate: 16000, Samples: ramp(16000 * 60)}, FileOptions{Realtime: realtime})
		if err != nil {
			t.Fatal(err)
		}
		<-s.Chunks()
		s.Close() // must return although nobody reads
		for range s.Chunks() {
		}
	}
}

func TestOpenFile(t *testing.T) {
	dir := t.TempDir()
	var b bytes.Buffer
	x := []float32{0, 0.5, -0.5, 0.25}
	if err := audio.WriteWAV(&b, 22050, x); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "a.wav")
	os.WriteFile(good, b.Bytes(), 0o644)
	bad := filepath.Join(dir, "bad.wav")
	os.WriteFile(bad, []byte("RIFF1234WAVEjunk"), 0o644)

	s, err := OpenFile(good, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []float32
	for c := range s.Chunks() {
		got = append(got, c...)
	}
	s.Close()
	if s.SampleRate() != 22050 || len(got) != len(x) {
		t.Fatalf("rate %d, %d samples; want 22050, %d", s.SampleRate(), len(got), len(x))
	}
	for i := range x { // 16-bit quantization: within half a step
		if d := got[i] - x[i]; d > 1.0/32768 || d < -1.0/32768 {
			t.Errorf("sample %d: %g, want %g", i, got[i], x[i])
		}
	}
	for _, tt := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.wav"), "missing.wav"},
		{bad, "bad.wav"},
	} {
		if _, err := OpenFile(tt.path, FileOptions{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("OpenFile(%s) = %v, want an error naming %s", tt.path, err, tt.want)
		}
	}
	for _, opts := range []FileOptions{{Chunk: -time.Second}, {Chunk: time.Nanosecond}} {
		if _, err := NewClipSource(&audio.Clip{SampleRate: 16000, Samples: x}, opts); err == nil {
			t.Errorf("chunk %v: no error", opts.Chunk)
		}
	}
	if _, err := NewClipSource(&audio.Clip{Samples: x}, FileOptions{}); err == nil {
		t.Error("rate 0: no error")
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(24000)
	r.Write([]float32{0.1, 0.2})
	r.Flush()
	r.Write([]float32{0.3})
	if got := r.Samples(); !slices.Equal(got, []float32{0.1, 0.2, 0.3}) {
		t.Errorf("samples %v", got)
	}
	if r.Writes() != 2 || !slices.Equal(r.Flushes(), []int64{2}) || r.Queued() != 0 || r.SampleRate() != 24000 {
		t.Errorf("writes %d flushes %v queued %v rate %d", r.Writes(), r.Flushes(), r.Queued(), r.SampleRate())
	}
	if r.Duration() != 125*time.Microsecond {
		t.Errorf("duration %v, want 125µs", r.Duration())
	}
	var b bytes.Buffer
	if err := r.WriteWAV(&b); err != nil {
		t.Fatal(err)
	}
	c, err := audio.DecodeBytes(b.Bytes(), audio.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.SampleRate != 24000 || len(c.Samples) != 3 {
		t.Errorf("WAV: %d Hz, %d samples", c.SampleRate, len(c.Samples))
	}
}

// fakeClock is a settable time source.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestJitter(t *testing.T) {
	clk := &fakeClock{t: time.Unix(0, 0)}
	j := newJitter(100, 50*time.Millisecond)
	j.now = clk.now
	buf := make([]float32, 64)
	read := func() int { return j.read(buf) }

	// Held until 100 samples are queued.
	j.write(ramp(60))
	if n := read(); n != 0 {
		t.Fatalf("read %d while prebuffering 60 of 100", n)
	}
	j.write(ramp(60))
	if n := read(); n != 64 {
		t.Fatalf("read %d with 120 queued, want 64", n)
	}
	if n := read(); n != 56 {
		t.Fatalf("read %d, want the remaining 56", n)
	}
	// Drained: held again; a short reply is released by time.
	j.write(ramp(10))
	clk.t = clk.t.Add(49 * time.Millisecond)
	if n := read(); n != 0 {
		t.Fatalf("read %d after 49 ms of holding (hold 50 ms)", n)
	}
	clk.t = clk.t.Add(time.Millisecond)
	if n := read(); n != 10 {
		t.Fatalf("read %d after 50 ms, want 10", n)
	}
	// Flush drops everything queued and holds.
	j.write(ramp(300))
	if n := read(); n != 64 {
		t.Fatalf("read %d, want 64", n)
	}
	if q := j.queued(); q != 236 {
		t.Fatalf("queued %d, want 236", q)
	}
	if n := j.flush(); n != 236 {
		t.Fatalf("flush dropped %d, want 236", n)
	}
	if n := read(); n != 0 || j.queued() != 0 {
		t.Fatalf("after flush: read %d, queued %d", n, j.queued())
	}
	w, p, d := j.counts()
	if w != 430 || p != 194 || d != 236 {
		t.Errorf("counts written %d pulled %d dropped %d; want 430 194 236", w, p, d)
	}
}

// The jitter buffer keeps samples in order across compactions and
// concurrent use.
func TestJitterOrderConcurrent(t *testing.T) {
	j := newJitter(0, 0)
	const n = 200000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i += 1000 {
			c := make([]float32, 1000)
			for k := range c {
				c[k] = float32(i + k)
			}
			j.write(c)
		}
	}()
	buf := make([]float32, 333)
	next := 0
	for next < n {
		m := j.read(buf)
		for _, v := range buf[:m] {
			if v != float32(next) {
				t.Fatalf("sample %d: got %g", next, v)
			}
			next++
		}
	}
	wg.Wait()
}

func TestOtoReader(t *testing.T) {
	j := newJitter(0, 0)
	x := []float32{0, 0.5, -1, 1, 2, -0.25}
	j.write(x)
	r := &otoReader{j: j}
	b := make([]byte, 7) // room for 3 samples and a half
	if n, err := r.Read(b); n != 6 || err != nil {
		t.Fatalf("Read = %d, %v; want 6 bytes", n, err)
	}
	b2 := make([]byte, 64)
	n, _ := r.Read(b2)
	got := append(b[:6], b2[:n]...)
	if want := audio.PCM16LE(x); !bytes.Equal(got, want) {
		t.Errorf("bytes % x, want % x (audio.PCM16LE)", got, want)
	}
	if n, err := r.Read(b2); n != 0 || err != nil {
		t.Errorf("empty: Read = %d, %v; want 0, nil (oto polls again)", n, err)
	}
}

// fakeOutput stands in for a sound server that has pulled some samples
// into its own buffer.
type fakeOutput struct {
	buf    int
	resets int
	fail   error
}

func (f *fakeOutput) buffered() int { return f.buf }
func (f *fakeOutput) reset()        { f.resets++; f.buf = 0 }
func (f *fakeOutput) err() error    { return f.fail }
func (f *fakeOutput) close() error  { return nil }

func TestPlayerAccounting(t *testing.T) {
	out := &fakeOutput{}
	p := &Player{rate: 1000, j: newJitter(0, 0), out: out}
	p.Write(make([]float32, 500))
	dst := make([]float32, 200)
	p.j.read(dst) // the device pulls 200 samples, 50 of them still in its buffer
	out.buf = 50
	if q, pl := p.Queued(), p.Played(); q != 350*time.Millisecond || pl != 150*time.Millisecond {
		t.Errorf("queued %v played %v; want 350ms 150ms", q, pl)
	}
	p.Flush()
	if out.resets != 1 || p.Queued() != 0 || p.Dropped() != 300*time.Millisecond {
		t.Errorf("after Flush: resets %d queued %v dropped %v", out.resets, p.Queued(), p.Dropped())
	}
	if p.Played() != 200*time.Millisecond {
		t.Errorf("played %v after the device buffer was reset (it was handed over), want 200ms", p.Played())
	}
	out.fail = errors.New("gone")
	if err := p.Write([]float32{1}); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("Write on a failed device = %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	out.fail = nil
	if err := p.Write([]float32{1}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Write after Close = %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// With no PulseAudio server the errors say what to do.
func TestNoServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := "unix:" + filepath.Join(t.TempDir(), "no-such-socket")
	_, err1 := OpenCapture(CaptureOptions{Server: srv})
	_, err2 := OpenPlayer(PlayerOptions{Device: "speaker", Server: srv})
	_, _, err3 := List(srv)
	for i, err := range []error{err1, err2, err3} {
		if !errors.Is(err, ErrNoAudioServer) {
			t.Errorf("%d: %v, want ErrNoAudioServer", i, err)
			continue
		}
		for _, want := range []string{"PulseAudio", "ALSA", "PULSE_SERVER", "--wav"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%d: %q does not mention %s", i, err, want)
			}
		}
	}
}

func TestOptionErrors(t *testing.T) {
	for _, o := range []CaptureOptions{{SampleRate: 100}, {Chunk: time.Hour}, {Queue: -1}} {
		if _, err := OpenCapture(o); err == nil || errors.Is(err, ErrNoAudioServer) {
			t.Errorf("OpenCapture(%+v) = %v, want an option error", o, err)
		}
	}
	for _, o := range []PlayerOptions{{SampleRate: 100}, {Latency: time.Millisecond}, {Prebuffer: -time.Second}} {
		if _, err := OpenPlayer(o); err == nil || errors.Is(err, ErrNoAudioServer) {
			t.Errorf("OpenPlayer(%+v) = %v, want an option error", o, err)
		}
	}
}

func TestPrintList(t *testing.T) {
	var b bytes.Buffer
	PrintList(&b, []Info{{Name: "mic.monitor", Description: "Mic", SampleRate: 48000, Channels: 2, Default: true}}, nil)
	s := b.String()
	for _, want := range []string{"* mic.monitor", "48000 Hz", "--input-device", "--output-device", "(none)"} {
		if !strings.Contains(s, want) {
			t.Errorf("listing lacks %q:\n%s", want, s)
		}
	}
}
