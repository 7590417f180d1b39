package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

const tinyModel = "../testdata/lfm2-audio-tiny"

func loadTiny(t testing.TB) (*lfm2audio.Model, *cpu.Device) {
	t.Helper()
	dev := cpu.New(0)
	m, err := lfm2audio.Load(dev, tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); dev.Close() })
	return m, dev
}

type collected struct {
	text   string
	tokens []int
	audio  [][]float32
	done   *DoneEvent
	err    error
}

func collect(t testing.TB, s *Stream, timeout time.Duration) collected {
	t.Helper()
	var c collected
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.Events:
			if !ok {
				if c.done == nil && c.err == nil {
					t.Fatal("events closed without a terminal event")
				}
				return c
			}
			switch ev := ev.(type) {
			case *TextEvent:
				c.text += ev.Delta
				c.tokens = append(c.tokens, ev.Token)
			case *AudioEvent:
				c.audio = append(c.audio, ev.Samples)
			case *DoneEvent:
				c.done = ev
			case *ErrorEvent:
				c.err = ev.Err
			}
		case <-deadline:
			t.Fatal("turn timed out")
		}
	}
}

func TestEngineSmoke(t *testing.T) {
	m, dev := loadTiny(t)
	e := New(m, dev, Options{Precision: nn.BF16})
	defer e.Close()
	s := e.NewSession()
	st, err := e.Start(context.Background(), s, Request{Text: "What is the capital of France?", MaxNewTokens: 60})
	if err != nil {
		t.Fatal(err)
	}
	c := collect(t, st, time.Minute)
	if c.err != nil {
		t.Fatal(c.err)
	}
	t.Logf("text %q, %d audio frames, timings %+v", c.text, len(c.audio), c.done.Timings)
}
