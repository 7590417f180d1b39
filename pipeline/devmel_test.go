package pipeline

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/testdev"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// TestDeviceLogMelTurns: on a device whose encoder queue computes the
// log-mel front end (CUDA: gpu.LogMeler), turns of spoken clips — three at
// once, so that the encoder batches clips whose features the device made —
// give the same text tokens and audio, bit for bit, as with the features
// computed on the host (Options.HostLogMel). (The device's float64 log may
// differ from Go's in its last bit, which turns into a float32 ulp of a
// feature about once in 10⁸ values: not on these clips.) Skipped where
// there is no CUDA device.
func TestDeviceLogMelTurns(t *testing.T) {
	dev := testdev.Open(t, "cuda")
	if _, ok := dev.NewQueue("probe").(gpu.LogMeler); !ok {
		t.Fatal("the CUDA queue does not compute the log-mel")
	}
	m, err := lfm2audio.Load(dev, tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tone := toneClip(t)
	n := len(tone.Samples)
	clips := []*audio.Clip{tone, {SampleRate: tone.SampleRate, Samples: tone.Samples[:n/2]}, {SampleRate: tone.SampleRate, Samples: tone.Samples[:n/5]}}
	run := func(host bool) []collected {
		e := New(m, dev, Options{Precision: nn.BF16, HostLogMel: host})
		defer e.Close()
		out := make([]collected, len(clips))
		var wg sync.WaitGroup
		for i, c := range clips {
			st, err := e.Start(context.Background(), e.NewSession(), Request{Audio: c, MaxNewTokens: 8, Seed: uint64(5 + i), AudioSampling: DefaultAudio})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { out[i] = collect(t, st, 5*time.Minute) })
		}
		wg.Wait()
		return out
	}
	hostRun, devRun := run(true), run(false)
	for i := range clips {
		h, d := hostRun[i], devRun[i]
		if h.err != nil || d.err != nil {
			t.Fatalf("clip %d: host run %v, device run %v", i, h.err, d.err)
		}
		if !slices.Equal(h.tokens, d.tokens) {
			t.Errorf("clip %d: text tokens %v on the host's features, %v on the device's", i, h.tokens, d.tokens)
		}
		if len(h.audio) != len(d.audio) {
			t.Errorf("clip %d: %d audio chunks against %d", i, len(h.audio), len(d.audio))
			continue
		}
		for k := range h.audio {
			if !slices.Equal(h.audio[k], d.audio[k]) {
				t.Errorf("clip %d: audio chunk %d differs", i, k)
				break
			}
		}
	}
}
