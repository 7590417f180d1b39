//go:build pulse

// A conversation through a real (private) PulseAudio server:
// go test -tags pulse ./pipeline/live. Needs the pulseaudio binary
// (apt-get install --no-install-recommends pulseaudio pulseaudio-utils).

package live

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio/device"
)

// startPulse runs pulseaudio with two null sinks: "user" (the test speaks
// into it; its monitor is the microphone) and "speaker" (the assistant's).
func startPulse(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("pulseaudio")
	if err != nil {
		t.Fatal("pulseaudio is not installed: apt-get install --no-install-recommends pulseaudio pulseaudio-utils " +
			"(this test runs only with -tags pulse)")
	}
	dir, err := os.MkdirTemp("", "pa")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "native")
	cmd := exec.Command(bin, "-n", "--daemonize=no", "--exit-idle-time=-1", "--disable-shm=yes",
		"-L", "module-native-protocol-unix socket="+sock+" auth-anonymous=1",
		"-L", "module-null-sink sink_name=user rate=16000 channels=1",
		"-L", "module-null-sink sink_name=speaker rate=24000 channels=1")
	cmd.Env = []string{"HOME=" + dir, "XDG_RUNTIME_DIR=" + dir, "PATH=" + os.Getenv("PATH")}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pulseaudio: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return "unix:" + sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("pulseaudio did not open %s within 10 s", sock)
		}
	}
}

// The question, played into the "user" sink, is heard on its monitor;
// the reply plays on the "speaker" sink, in full.
func TestPulseConversation(t *testing.T) {
	srv := startPulse(t)
	f := load(t)
	e := f.engine(t)
	mic, err := device.OpenCapture(device.CaptureOptions{Server: srv, Device: "user.monitor"})
	if err != nil {
		t.Fatal(err)
	}
	defer mic.Close()
	speaker, err := device.OpenPlayer(device.PlayerOptions{Server: srv, Device: "speaker"})
	if err != nil {
		t.Fatal(err)
	}
	defer speaker.Close()
	user, err := device.OpenPlayer(device.PlayerOptions{Server: srv, Device: "user", SampleRate: rate})
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	for range 2 {
		user.Write(f.noise)
	}
	user.Write(f.speech)
	for range 8 {
		user.Write(f.noise)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := &recorded{}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Engine: e, Source: mic, Sink: speaker, Request: greedy, OnEvent: evs.add})
	}()
	// Once the reply has played out, hang up. The deadline only guards
	// against a hang.
	var reply time.Duration
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ends := evs.of(TurnEnd); len(ends) > 0 {
			reply = ends[0].Audio
			if speaker.Queued() == 0 && speaker.Played() >= reply {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reply played within 30 s (events %s)", evs.kinds())
		}
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run = %v (events %s)", err, evs.kinds())
	}
	t.Logf("events %s; reply %v, played %v, dropped %v", evs.kinds(), reply, speaker.Played(), speaker.Dropped())
	if len(evs.of(TurnStart)) != 1 || len(evs.of(TurnEnd)) != 1 || evs.of(TurnEnd)[0].Err != nil {
		t.Fatalf("want one complete turn, got events %s", evs.kinds())
	}
	if speaker.Played() != reply || speaker.Dropped() != 0 {
		t.Errorf("played %v and dropped %v of a %v reply", speaker.Played(), speaker.Dropped(), reply)
	}
}
