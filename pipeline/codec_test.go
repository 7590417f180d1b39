package pipeline

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// TestDetokenizerTurn: a turn of an LFM2.5 folder decodes with the
// detokenizer; its audio events (the first frame 480 samples short, the
// flush's 480 at the end) concatenate to the whole decode of the turn's
// recorded frames, which are the frames the same turn gives with Mimi.
func TestDetokenizerTurn(t *testing.T) {
	dir := testmodel.LFM25Tiny(t, true)
	run := func(codec string) (collected, *Recorder, *lfm2audio.Model) {
		dev := cpu.New(0)
		m, err := lfm2audio.LoadWith(dev, dir, lfm2audio.Options{Codec: codec})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close(); dev.Close() })
		e := New(m, dev, Options{Precision: nn.BF16})
		defer e.Close()
		rec := NewRecorder()
		st, err := e.Start(context.Background(), e.NewSession(), Request{Text: "Say something.", MaxNewTokens: 40, Record: rec})
		if err != nil {
			t.Fatal(err)
		}
		c := collect(t, st, time.Minute)
		if c.err != nil {
			t.Fatal(c.err)
		}
		return c, rec, m
	}
	cd, recD, m := run("")
	cm, recM, _ := run(lfm2audio.CodecMimi)
	if m.Codec.Kind() != lfm2audio.CodecDetokenizer {
		t.Fatalf("codec %s", m.Codec.Kind())
	}
	codesD, shape, _ := recD.Ints("mimi_codes")
	codesM, _, _ := recM.Ints("mimi_codes")
	if !slices.Equal(codesD, codesM) {
		t.Fatal("the codec changed the generated codes")
	}
	T := shape[1]
	if T == 0 || len(cd.audio) == 0 {
		t.Fatalf("%d frames, %d audio events", T, len(cd.audio))
	}
	if len(cm.audio) != T || len(cd.audio) != T+1 {
		t.Errorf("%d frames: %d Mimi events, %d detokenizer events (want %d, %d)", T, len(cm.audio), len(cd.audio), T, T+1)
	}
	frames := make([][]int, T)
	for f := range T {
		for k := range shape[0] {
			frames[f] = append(frames[f], codesD[k*T+f])
		}
	}
	whole, err := m.Codec.Decode(context.Background(), frames)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Concat(cd.audio...)
	if !slices.Equal(got, whole) {
		t.Errorf("the turn's %d samples differ from the whole decode's %d", len(got), len(whole))
	}
	if n := len(cd.audio[0]); n != 1920-480 {
		t.Errorf("first event %d samples, want 1440", n)
	}
	if n := len(cd.audio[len(cd.audio)-1]); n != 480 {
		t.Errorf("last event %d samples, want 480", n)
	}
	if wav, _, _ := recD.Floats("wav_mimi_stream"); !slices.Equal(wav, whole) {
		t.Error("the recorder's waveform differs from the whole decode")
	}
	if d := cd.done.Timings.AudioSeconds; math.Abs(d-float64(T)*0.08) > 1e-9 {
		t.Errorf("audio seconds %v for %d frames", d, T)
	}
}
