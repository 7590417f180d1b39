package pipeline

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMemoryAdmission: a turn reserves its KV cache, history and codec
// state when it starts; with a budget that holds one such turn and a half,
// a second is refused with a *MemoryError (ErrNoMemory) that says what it
// needs, and admitted once the first conversation is closed. Every byte
// comes back.
func TestMemoryAdmission(t *testing.T) {
	m, dev := loadTiny(t)
	req := Request{Text: "Hello there", MaxNewTokens: 300, Teacher: endless{m.Info().Special}}
	probe := New(m, dev, Options{MemoryBudget: -1})
	if got := probe.Memory(); got.Budget != math.MaxInt64 || got.Used != 0 {
		t.Fatalf("a new engine without a limit: %+v", got)
	}
	st, err := probe.Start(context.Background(), probe.NewSession(), req)
	if err != nil {
		t.Fatal(err)
	}
	one := probe.Memory()
	st.Cancel()
	collect(t, st, time.Minute)
	probe.Close()
	if one.KV < 1 || one.History < 1 || one.Codec < 1 {
		t.Fatalf("a started turn reserved %+v: want KV, history and codec bytes", one)
	}
	// The KV share is the cache for every position the turn may reach,
	// in whole 256-position blocks.
	t.Logf("one turn reserves %+v", one)

	e := New(m, dev, Options{MemoryBudget: one.Used * 3 / 2})
	defer e.Close()
	a := e.NewSession()
	sa, err := e.Start(context.Background(), a, req)
	if err != nil {
		t.Fatal(err)
	}
	<-sa.Events // it generates
	b := e.NewSession()
	_, err = e.Start(context.Background(), b, req)
	var me *MemoryError
	if !errors.Is(err, ErrNoMemory) || !errors.As(err, &me) || me.Need != one.Used || me.Budget != one.Used*3/2 || me.Free >= me.Need {
		t.Fatalf("second turn: %v (%+v), want a MemoryError needing %d", err, me, one.Used)
	}
	if b.Busy() {
		t.Error("a refused turn left its session busy")
	}
	sa.Cancel() // a cancelled turn frees its reservation at the next boundary
	if c := collect(t, sa, time.Minute); !errors.Is(c.err, context.Canceled) {
		t.Fatalf("cancelled turn ended with %v", c.err)
	}
	held := e.Memory()
	if held.Codec != 0 || held.KV == 0 || held.Used >= one.Used {
		t.Errorf("after the turn, the conversation holds %+v: want its KV cache and history, no codec", held)
	}
	a.Close()
	if got := e.Memory(); got.Used != 0 {
		t.Fatalf("after closing the conversation %+v is in use", got)
	}
	sb, err := e.Start(context.Background(), b, req)
	if err != nil {
		t.Fatalf("after the first conversation closed: %v", err)
	}
	sb.Cancel()
	collect(t, sb, time.Minute)
	b.Close()
	if got := e.Memory(); got.Used != 0 {
		t.Errorf("at the end %+v is in use", got)
	}
}

// TestMemoryLeak: 200 conversations join and leave (eight at a time, some
// cancelled mid-turn); afterwards the engine counts no byte in use, the
// device holds about what it held after the first wave, and once the
// engine closes no goroutine is left.
func TestMemoryLeak(t *testing.T) {
	m, dev := loadTiny(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := New(m, dev, Options{MaxTurns: 8})
	wave := func(n int, from int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := e.NewSession()
				defer s.Close()
				st, err := e.Start(context.Background(), s, Request{Text: "Hi", MaxNewTokens: 8 + (from+i)%5, Seed: uint64(from + i)})
				if err != nil {
					t.Error(err)
					return
				}
				if (from+i)%3 == 0 {
					st.Cancel()
				}
				for range st.Events {
				}
			}()
		}
		wg.Wait()
	}
	var first int64
	for from := 0; from < 200; from += 8 {
		wave(8, from)
		if from == 0 {
			first = dev.Info().MemUsed
		}
	}
	if got := e.Memory(); got.Used != 0 || got.KV != 0 || got.History != 0 || got.Codec != 0 {
		t.Errorf("after 200 conversations left: %+v in use", got)
	}
	// The stages' scratch arenas grow to the largest batch they saw (the
	// batched codec's passes hold up to 32 frames across its streams), so
	// the device's bytes may rise by up to about 32 conversations' worth; a
	// conversation's KV cache or codec stream left behind would add up over
	// the 192 conversations after the first wave, six times that.
	one := e.kvFor(16) + e.codecBytes
	if got := dev.Info().MemUsed; got-first > 32*one {
		t.Errorf("the device holds %d bytes, %d after the first wave: %d more, a conversation holds %d", got, first, got-first, one)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestMemAvailable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		text string
		want int64
		ok   bool
	}{
		{"MemTotal:       24000000 kB\nMemAvailable:   23000000 kB\n", 23000000 << 10, true},
		{"MemTotal:       24000000 kB\n", 0, false},
		{"MemAvailable:   lots kB\n", 0, false},
	} {
		p := filepath.Join(dir, "meminfo")
		if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := memAvailable(p)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%q: %d, %v; want %d (ok %v)", tc.text, got, err, tc.want, tc.ok)
		}
	}
	if _, err := memAvailable(filepath.Join(dir, "none")); err == nil {
		t.Error("a missing file gave no error")
	}
}
