//go:build pulse

// These tests run a private PulseAudio server (pulseaudio -n with a null
// sink) and play and record through it: go test -tags pulse ./audio/device.
// They need the pulseaudio binary (Debian/Ubuntu: apt-get install
// --no-install-recommends pulseaudio pulseaudio-utils) and fail without it.

package device

import (
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio/vad"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

const nullSink = "omni_null"

// startPulse starts pulseaudio with a 24 kHz mono null sink on a private
// socket and returns its server string; the server is killed at cleanup.
func startPulse(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("pulseaudio")
	if err != nil {
		t.Fatal("pulseaudio is not installed: apt-get install --no-install-recommends pulseaudio pulseaudio-utils " +
			"(these tests run only with -tags pulse)")
	}
	dir, err := os.MkdirTemp("", "pa") // short: a socket path has a length limit
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "native")
	cmd := exec.Command(bin, "-n", "--daemonize=no", "--exit-idle-time=-1", "--disable-shm=yes", "--log-target=stderr",
		"-L", "module-native-protocol-unix socket="+sock+" auth-anonymous=1",
		"-L", "module-null-sink sink_name="+nullSink+" rate=24000 channels=1")
	cmd.Env = []string{"HOME=" + dir, "XDG_RUNTIME_DIR=" + dir, "PATH=" + os.Getenv("PATH")}
	log, _ := os.Create(filepath.Join(dir, "log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pulseaudio: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		log.Close()
		os.RemoveAll(dir)
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Fatalf("pulseaudio did not open %s within 10 s; its log:\n%s", sock, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "unix:" + sock
}

// waitFor polls cond until it holds; the deadline only guards against a
// hang, it decides nothing about speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestPulseList(t *testing.T) {
	srv := startPulse(t)
	sources, sinks, err := List(srv)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(sinks, func(i Info) bool { return i.Name == nullSink && i.Default && i.SampleRate == 24000 }) {
		t.Errorf("sinks %+v lack the default %s at 24 kHz", sinks, nullSink)
	}
	if !slices.ContainsFunc(sources, func(i Info) bool { return i.Name == nullSink+".monitor" }) {
		t.Errorf("sources %+v lack %s.monitor", sources, nullSink)
	}
}

func tone(n, rate int, amp float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(amp * math.Sin(2*math.Pi*440*float64(i)/float64(rate)))
	}
	return x
}

// Player → null sink → its monitor → Capture: the tone comes back.
func TestPulseLoopback(t *testing.T) {
	srv := startPulse(t)
	rec, err := OpenCapture(CaptureOptions{Server: srv, Device: nullSink + ".monitor", SampleRate: 24000})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	p, err := OpenPlayer(PlayerOptions{Server: srv, Device: nullSink})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Write(tone(24000, 24000, 0.5))
	var got []float32
	waitFor(t, "one second played", func() bool {
		for {
			select {
			case c := <-rec.Chunks():
				got = append(got, c...)
				continue
			default:
			}
			return p.Played() >= time.Second && p.Queued() == 0
		}
	})
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); { // the server's latency
		select {
		case c := <-rec.Chunks():
			got = append(got, c...)
		case <-time.After(10 * time.Millisecond):
		}
	}
	var peak float64
	loud := 0
	for _, v := range got {
		peak = max(peak, math.Abs(float64(v)))
		if math.Abs(float64(v)) > 0.25 {
			loud++
		}
	}
	t.Logf("recorded %d samples, peak %.4f, %d above 0.25; played %v, dropped %v", len(got), peak, loud, p.Played(), p.Dropped())
	// The null sink mixes in 16-bit: the peak comes back within a few
	// quantization steps of 0.5, at the server's unity volume.
	if math.Abs(peak-0.5) > 4.0/32768 {
		t.Errorf("peak %.5f, want 0.5", peak)
	}
	// A 0.5 sine exceeds 0.25 two thirds of the time: about 16000 of the
	// 24000 samples, unless the recording lost part of the tone.
	if loud < 15000 {
		t.Errorf("%d samples above 0.25, want about 16000 (a second of tone)", loud)
	}
}

// Flush drops the queue at once.
func TestPulseFlush(t *testing.T) {
	srv := startPulse(t)
	p, err := OpenPlayer(PlayerOptions{Server: srv, Device: nullSink})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Write(tone(24000*5, 24000, 0.1))
	waitFor(t, "playing", func() bool { return p.Played() > 200*time.Millisecond })
	p.Flush()
	if q := p.Queued(); q != 0 {
		t.Errorf("queued %v after Flush", q)
	}
	if d, pl := p.Dropped(), p.Played(); d+pl != 5*time.Second || d < 3*time.Second {
		t.Errorf("dropped %v + played %v, want 5 s with most of it dropped", d, pl)
	}
}

// The oto output (the default, no Device) plays through $PULSE_SERVER.
func TestPulseOto(t *testing.T) {
	srv := startPulse(t)
	t.Setenv("PULSE_SERVER", srv)
	p, err := OpenPlayer(PlayerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Write(tone(12000, 24000, 0.1))
	waitFor(t, "half a second played", func() bool { return p.Played() == 500*time.Millisecond && p.Queued() == 0 })
	p.Write(tone(24000*5, 24000, 0.1))
	waitFor(t, "playing again", func() bool { return p.Played() > 700*time.Millisecond })
	p.Flush()
	if q := p.Queued(); q != 0 {
		t.Errorf("queued %v after Flush", q)
	}
	if p.Dropped() < 3*time.Second {
		t.Errorf("dropped %v of 5 s", p.Dropped())
	}
}

// The fixture's question played into the null sink and recorded from its
// monitor at 16 kHz is one utterance to the VAD.
func TestPulseSpeechToVAD(t *testing.T) {
	srv := startPulse(t)
	f, err := safetensors.Open("../../testdata/lfm2-audio-tiny/case1_question_16k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw, _ := f.Lookup("input_wav")
	q, _ := tw.Float32s()
	rec, err := OpenCapture(CaptureOptions{Server: srv, Device: nullSink + ".monitor"})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	p, err := OpenPlayer(PlayerOptions{Server: srv, Device: nullSink, SampleRate: 16000})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Room noise (the question's first half second) around the question:
	// the VAD's floor is relative to it.
	noise := q[:8000]
	for range 4 {
		p.Write(noise)
	}
	p.Write(q)
	for range 4 {
		p.Write(noise)
	}
	d, err := vad.New(vad.Config{SampleRate: rec.SampleRate()})
	if err != nil {
		t.Fatal(err)
	}
	var evs []vad.Event
	waitFor(t, "the question's end", func() bool {
		select {
		case c := <-rec.Chunks():
			evs = append(evs, d.Write(c)...)
		case <-time.After(50 * time.Millisecond):
		}
		return len(evs) >= 2 || p.Queued() == 0 && p.Played() > 9*time.Second
	})
	if len(evs) != 2 || evs[0].Kind != vad.Start || evs[1].Kind != vad.End {
		t.Fatalf("events %+v, want one utterance", evs)
	}
	// Speech is 0.55 s to 4.33 s of the question (vad's fixture test):
	// 3.78 s, plus 0.5 s of pre- and post-roll, give or take a frame at
	// either end.
	n := float64(len(evs[1].Audio)) / 16000
	t.Logf("utterance: %.3f s", n)
	if math.Abs(n-4.28) > 0.03 {
		t.Errorf("utterance %.3f s long, want 4.28 s", n)
	}
}
