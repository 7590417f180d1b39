package pipeline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omni-pipe/omni-pipe/audio"
)

// TestEncoderBatchesWaitingTurns: turns whose clips reach the encoder
// while it is busy are encoded together in one batch (one trace interval
// of the encoder holding them all), a cancelled turn among them passes
// through and ends cancelled, and every other turn's encoder and adapter
// rows and its whole reply (tokens and audio) are bit for bit those of the
// same turn run alone. Closing the engine leaves no goroutine behind.
func TestEncoderBatchesWaitingTurns(t *testing.T) {
	var hold atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	m, dev := loadTinyHooked(t, func(c hookCall) error {
		// The first turn's first encoder read (its recorded encoder_out)
		// waits until the others queue at the encoder.
		if c.Queue == StageEncoder && c.Op == "Read" && hold.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
		return nil
	})
	tone := toneClip(t)
	cut := func(n int) *audio.Clip {
		return &audio.Clip{SampleRate: tone.SampleRate, Samples: tone.Samples[:n]}
	}
	n := len(tone.Samples)
	clips := []*audio.Clip{tone, cut(n / 2), cut(n / 7), cut(700)} // 700 samples: a few mel frames
	req := func(i int) Request {
		return Request{Audio: clips[i], MaxNewTokens: 6, Seed: uint64(11 + i), AudioSampling: DefaultAudio, Record: NewRecorder()}
	}

	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tr := &Trace{}
	e := New(m, dev, Options{Trace: tr})
	defer e.Close()
	hold.Store(true)
	reqs := make([]Request, len(clips))
	streams := make([]*Stream, len(clips))
	start := func(i int) {
		reqs[i] = req(i)
		st, err := e.Start(context.Background(), e.NewSession(), reqs[i])
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	start(0)
	<-held
	for i := 1; i < len(clips); i++ {
		start(i)
		if i == 1 { // a turn cancelled before its clip's features, among the batch's
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			st, err := e.Start(ctx, e.NewSession(), req(1))
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if c := collect(t, st, time.Minute); !errors.Is(c.err, context.Canceled) {
					t.Errorf("the cancelled turn ended with %v", c.err)
				}
			}()
		}
	}
	waiting := len(clips) // the other clips' turns and the cancelled one
	for deadline := time.Now().Add(time.Minute); len(e.front.enc.in) < waiting; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d turns wait at the encoder, want %d", len(e.front.enc.in), waiting)
		}
	}
	close(release)
	batched := make([]collected, len(clips))
	for i, st := range streams {
		if batched[i] = collect(t, st, time.Minute); batched[i].err != nil {
			t.Fatalf("turn %d: %v", i, batched[i].err)
		}
	}
	var sizes []int
	for _, iv := range tr.Intervals() {
		if iv.Stage == StageEncoder {
			sizes = append(sizes, len(iv.Turns))
		}
	}
	if !slices.Equal(sizes, []int{1, len(clips) - 1}) {
		t.Errorf("the encoder's batches held %v turns, want the first turn alone and then the %d others together", sizes, len(clips)-1)
	}

	for i := range clips {
		r := req(i)
		alone := run(t, e, e.NewSession(), r)
		if !slices.Equal(alone.tokens, batched[i].tokens) || !slices.Equal(bits(flat(alone.audio)), bits(flat(batched[i].audio))) {
			t.Errorf("clip %d: the reply differs: tokens %v batched, %v alone", i, batched[i].tokens, alone.tokens)
		}
		for _, name := range []string{"encoder_out", "adapter_out"} {
			got, gotShape, ok1 := reqs[i].Record.Floats(name)
			want, wantShape, ok2 := r.Record.Floats(name)
			if !ok1 || !ok2 || !slices.Equal(gotShape, wantShape) || !slices.Equal(bits(got), bits(want)) {
				t.Errorf("clip %d: %s %v batched, %v alone (recorded %v, %v): not the same bits", i, name, gotShape, wantShape, ok1, ok2)
			}
		}
	}
}

// bits returns the bit patterns of v (so that NaNs and signed zeros
// compare exactly).
func bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

// TestEncoderBatchFailureFailsOnlyItsClip: when a batch of clips fails in
// the encoder (here a device fault on the batch's read), each clip is
// encoded again alone, so that only the clip that fails again (the
// batch's first) fails its turn, with a *StagePanic of the encoder; the
// others reply exactly as alone.
func TestEncoderBatchFailureFailsOnlyItsClip(t *testing.T) {
	var reads atomic.Int32
	held, release := make(chan struct{}), make(chan struct{})
	m, dev := loadTinyHooked(t, func(c hookCall) error {
		if c.Queue != StageEncoder || c.Op != "Read" {
			return nil
		}
		switch reads.Add(1) {
		case 1: // the first turn, alone: the others queue meanwhile
			close(held)
			<-release
		case 2, 3: // the batch's read, then its first clip's alone
			panic("device fault")
		}
		return nil
	})
	tone := toneClip(t)
	clips := []*audio.Clip{tone, {SampleRate: tone.SampleRate, Samples: tone.Samples[:5000]},
		{SampleRate: tone.SampleRate, Samples: tone.Samples[:9000]}, {SampleRate: tone.SampleRate, Samples: tone.Samples[:3000]}}
	req := func(i int) Request {
		return Request{Audio: clips[i], MaxNewTokens: 6, Seed: uint64(3 + i), AudioSampling: DefaultAudio}
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := New(m, dev, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer e.Close()
	streams := make([]*Stream, len(clips))
	for i := range clips {
		st, err := e.Start(context.Background(), e.NewSession(), req(i))
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
		if i == 0 {
			<-held
		}
	}
	for deadline := time.Now().Add(time.Minute); len(e.front.enc.in) < len(clips)-1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d turns wait at the encoder, want %d", len(e.front.enc.in), len(clips)-1)
		}
	}
	close(release)
	got := make([]collected, len(clips))
	for i, st := range streams {
		got[i] = collect(t, st, time.Minute)
	}
	var p *StagePanic
	if !errors.As(got[1].err, &p) || p.Stage != StageEncoder {
		t.Errorf("the batch's first clip ended with %v, want the encoder's *StagePanic", got[1].err)
	}
	for i, c := range got {
		if i == 1 {
			continue
		}
		if c.err != nil {
			t.Errorf("clip %d failed too: %v", i, c.err)
			continue
		}
		alone := run(t, e, e.NewSession(), req(i))
		if !slices.Equal(alone.tokens, c.tokens) || !slices.Equal(bits(flat(alone.audio)), bits(flat(c.audio))) {
			t.Errorf("clip %d: the reply differs from the clip's alone", i)
		}
	}
}
