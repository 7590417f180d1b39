package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// TestCodecBatchEqualsAlone: two concurrent turns that speak from their
// first step (sequential turns taught to start audio at once), with a codec
// slower than the loop (each pass sleeps), so that both turns' frames wait
// at its boundaries, are decoded in shared batches (a codec interval names
// both turns), and each turn's tokens and audio equal, bit for bit, the
// same turn run alone.
func TestCodecBatchEqualsAlone(t *testing.T) {
	m, dev := loadTinyHooked(t, func(c hookCall) error {
		if c.Queue == codecQueue && c.Op == "Embed" {
			time.Sleep(20 * time.Millisecond) // a pass: two Embeds
		}
		return nil
	})
	codecBatchEqualsAlone(t, m, dev)
}

// TestDetokenizerBatchEqualsAlone is TestCodecBatchEqualsAlone for an
// LFM2.5 model decoding with its detokenizer (family.BatchCodec too): two
// concurrent turns share codec calls, and each turn's tokens and audio
// (its flush included) equal the same turn run alone, bit for bit.
func TestDetokenizerBatchEqualsAlone(t *testing.T) {
	cd := cpu.New(0)
	dev := newHookDev(cd, func(c hookCall) error {
		if c.Queue == detokQueue && c.Op == "Embed" {
			time.Sleep(20 * time.Millisecond) // a pass: one Embed
		}
		return nil
	})
	m, err := lfm2audio.Load(dev, testmodel.LFM25Tiny(t, false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); cd.Close() })
	if m.Codec.Kind() != lfm2audio.CodecDetokenizer {
		t.Fatalf("codec %s", m.Codec.Kind())
	}
	codecBatchEqualsAlone(t, m, dev)
}

// detokQueue is the name stages/detok gives its queue.
const detokQueue = "detokenizer"

func codecBatchEqualsAlone(t *testing.T, m *lfm2audio.Model, dev gpu.Device) {
	reqs := []Request{
		{Text: "Say something.", Mode: Sequential, MaxNewTokens: 24, Seed: 3, AudioSampling: DefaultAudio},
		{Text: "Tell me about the sea.", Mode: Sequential, MaxNewTokens: 24, Seed: 4, AudioSampling: DefaultAudio},
	}
	run := func(tr *Trace, reqs ...Request) []collected {
		e := New(m, dev, Options{Trace: tr})
		defer e.Close()
		teach := speakNow{e.info.Special}
		out := make([]collected, len(reqs))
		var wg sync.WaitGroup
		for i, req := range reqs {
			req.Teacher = teach
			st, err := e.Start(context.Background(), e.NewSession(), req)
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = collect(t, st, time.Minute)
			}()
		}
		wg.Wait()
		for i, c := range out {
			if c.err != nil {
				t.Fatalf("turn %d: %v", i, c.err)
			}
		}
		return out
	}
	alone := []collected{run(nil, reqs[0])[0], run(nil, reqs[1])[0]}
	tr := &Trace{}
	together := run(tr, reqs...)
	for i := range reqs {
		if len(alone[i].audio) == 0 {
			t.Fatalf("turn %d made no audio", i)
		}
		if !slices.Equal(together[i].tokens, alone[i].tokens) {
			t.Errorf("turn %d: tokens %v together, %v alone", i, together[i].tokens, alone[i].tokens)
		}
		a, b := slices.Concat(together[i].audio...), slices.Concat(alone[i].audio...)
		if !slices.Equal(a, b) {
			t.Errorf("turn %d: %d samples together differ from the %d alone", i, len(a), len(b))
		}
	}
	batched := 0
	for _, iv := range tr.Intervals() {
		if iv.Stage != StageCodec {
			continue
		}
		if len(iv.Rows) != len(iv.Turns) || len(iv.Steps) != sum(iv.Rows) {
			t.Fatalf("codec interval %+v: want Rows (frames per turn) for every turn, summing to the Steps", iv)
		}
		if len(iv.Turns) > 1 {
			batched++
		}
	}
	t.Logf("%d codec intervals decoded both turns' frames", batched)
	if batched == 0 {
		t.Error("no codec interval decoded both turns' frames together")
	}
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

// speakNow is a Teacher that starts a sequential turn's audio at its first
// text pick and keeps it speaking (the end-of-audio code becomes code 0).
type speakNow struct{ sp family.Special }

func (n speakNow) Text(_, _ int, _ []float32) int { return n.sp.AudioStart }

func (n speakNow) AudioCode(_, _, picked int, _ []float32) int {
	if picked == n.sp.EOA {
		return 0
	}
	return picked
}

// TestCodecBatchPanic: a panic inside a batched decode ends every turn of
// the batch with a *StagePanic of the codec stage, frees their slots, and
// the engine goes on serving.
func TestCodecBatchPanic(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	m, dev := loadTinyHooked(t, func(c hookCall) error {
		if c.Queue == codecQueue && c.Op == "Embed" {
			time.Sleep(20 * time.Millisecond) // slower than the loop: frames wait
			if strings.Contains(string(debug.Stack()), "(*Engine).decodeBatch(") && armed.CompareAndSwap(true, false) {
				panic("device fault")
			}
		}
		return nil
	})
	e := New(m, dev, Options{Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	teach := speakNow{e.info.Special}
	var sts []*Stream
	for _, text := range []string{"Say something.", "Tell me about the sea."} {
		st, err := e.Start(context.Background(), e.NewSession(), Request{Text: text, Mode: Sequential, MaxNewTokens: 24, Teacher: teach})
		if err != nil {
			t.Fatal(err)
		}
		sts = append(sts, st)
	}
	out := make([]collected, len(sts))
	var wg sync.WaitGroup
	for i, st := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = collect(t, st, time.Minute)
		}()
	}
	wg.Wait()
	if armed.Load() {
		t.Fatal("no batched decode ran")
	}
	for i, c := range out {
		var p *StagePanic
		if !errors.As(c.err, &p) || p.Stage != StageCodec {
			t.Errorf("turn %d ended with %v, want a *StagePanic of the codec stage", i, c.err)
		}
	}
	if e.Running() != 0 {
		t.Errorf("%d turns still running after the panic", e.Running())
	}
	if c := run(t, e, e.NewSession(), Request{Text: "Hi", MaxNewTokens: 8}); len(c.tokens) == 0 {
		t.Error("no reply after the panic")
	}
}

// TestStepOpen: the codec waits only while frames follow the last
// depthformer step's mark.
func TestStepOpen(t *testing.T) {
	tu := &turn{}
	frame, final, mark := codecMsg{t: tu}, codecMsg{t: tu, final: true}, codecMsg{stepEnd: true}
	for _, c := range []struct {
		name    string
		pending []codecMsg
		want    bool
	}{
		{"empty", nil, false},
		{"a frame", []codecMsg{frame}, true},
		{"frames then the mark", []codecMsg{frame, frame, mark}, false},
		{"the mark then a frame", []codecMsg{frame, mark, frame}, true},
		{"a final after a frame", []codecMsg{frame, final}, true},
		{"a final after the mark", []codecMsg{frame, mark, final}, false},
		{"finals only", []codecMsg{final, final}, false},
	} {
		if got := stepOpen(c.pending); got != c.want {
			t.Errorf("%s: stepOpen = %v, want %v", c.name, got, c.want)
		}
	}
}
