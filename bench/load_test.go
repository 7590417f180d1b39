package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/server"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// TestLoadAgainstServer runs the load generator against the real server
// (the tiny model on a loopback port, /v1/audio/chat's SSE) and in process,
// with 1 and 3 sessions: every session gets its speech, the report's
// aggregates agree with its sessions, the table and the SVG are written.
func TestLoadAgainstServer(t *testing.T) {
	dev := cpu.New(2)
	defer dev.Close()
	m, err := lfm2audio.Load(dev, testmodel.LFM2AudioTiny())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng := pipeline.New(m, dev, pipeline.Options{MaxTurns: 4})
	defer eng.Close()
	srv := server.New(server.Config{MaxConcurrent: 4, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv.SetBackend(&server.Backend{Engine: eng, Model: m.Name, Device: dev.Name(), GPU: dev})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()

	opts := bench.LoadOptions{ClipSeconds: 1, MaxNewTokens: 24, Seed: 3}
	for _, tgt := range []bench.Target{bench.HTTPTarget("http://"+ln.Addr().String(), "", nil), bench.EngineTarget(eng, false)} {
		reps, err := bench.LoadCurve(context.Background(), tgt, []int{1, 3}, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reps {
			if r.Failed != 0 || len(r.PerSession) != r.Sessions {
				t.Fatalf("%s, %d sessions: %d failed: %+v", tgt.Name(), r.Sessions, r.Failed, r.PerSession)
			}
			var audio float64
			for _, s := range r.PerSession {
				if s.Chunks == 0 || s.FirstAudioMS <= 0 || s.AudioSeconds <= 0 || s.RTF <= 0 || s.EndMS < s.StartMS+s.FirstAudioMS {
					t.Errorf("%s: session %+v", tgt.Name(), s)
				}
				audio += s.AudioSeconds
			}
			if got := audio / r.WallSeconds; got-r.AudioPerSecond > 1e-9 || r.AudioPerSecond-got > 1e-9 {
				t.Errorf("%s: audio per second %g, sessions say %g", tgt.Name(), r.AudioPerSecond, got)
			}
			if r.MemoryBudget <= 0 || r.MemoryPeakBytes <= 0 {
				t.Errorf("%s: memory peak %d of %d", tgt.Name(), r.MemoryPeakBytes, r.MemoryBudget)
			}
		}
		var table, svg bytes.Buffer
		if err := bench.PrintLoad(&table, reps); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(table.String(), "largest N without an underrun") || strings.Count(table.String(), "\n") != 5 {
			t.Errorf("table:\n%s", table.String())
		}
		if err := bench.WriteLoadSVG(&svg, reps); err != nil || !strings.HasPrefix(svg.String(), "<svg") {
			t.Errorf("svg: %v", err)
		}
		if _, err := json.Marshal(reps); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", table.String())
	}
}

// TestUnderruns: the jitter buffer's playback, chunk by chunk.
func TestUnderruns(t *testing.T) {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	for _, tc := range []struct {
		name   string
		at     []int // arrival of 80 ms chunks
		stalls []int // the underruns' stalls
	}{
		{"steady", []int{0, 80, 160, 240, 320}, nil},
		{"bursty but covered", []int{0, 200, 210, 400}, nil},
		{"late", []int{0, 80, 400}, []int{400 + 160 - 320}},
		{"first buffered only", []int{100, 500}, []int{500 + 160 - (100 + 160 + 80)}},
		{"two", []int{0, 300, 900}, []int{300 + 160 - 240, 900 + 160 - (460 + 80)}},
	} {
		var chunks []bench.Chunk
		for _, a := range tc.at {
			chunks = append(chunks, bench.Chunk{At: ms(a), Dur: ms(80)})
		}
		got := bench.Underruns(chunks, bench.JitterBuffer)
		if len(got) != len(tc.stalls) {
			t.Errorf("%s: %d underruns %v, want %d", tc.name, len(got), got, len(tc.stalls))
			continue
		}
		for i, u := range got {
			if u.Stall != ms(tc.stalls[i]) {
				t.Errorf("%s: underrun %d stalls %v, want %v", tc.name, i, u.Stall, ms(tc.stalls[i]))
			}
		}
	}
}

// instantTarget answers every turn at once with a few chunks of speech.
type instantTarget struct{}

func (instantTarget) Name() string { return "instant" }
func (instantTarget) Turn(ctx context.Context, _ *audio.Clip, _ uint64, _ int, sink func(samples, rate int)) error {
	for range 3 {
		sink(1920, 24000)
	}
	return ctx.Err()
}
func (instantTarget) Memory(context.Context) (int64, int64, bool) { return 0, 0, false }

// TestLoadRamp: with a ramp, session i starts no sooner than i·ramp/N into
// the run (a lower bound only: a loaded machine may start it later); a
// negative ramp is refused; a run cancelled during the ramp fails the
// sessions not yet started and says so.
func TestLoadRamp(t *testing.T) {
	const n, ramp = 4, 120 * time.Millisecond
	rep, err := bench.Load(context.Background(), instantTarget{}, bench.LoadOptions{Sessions: n, ClipSeconds: 0.5, Ramp: ramp})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range rep.PerSession {
		if lo := float64(ramp.Milliseconds()) * float64(i) / n; s.StartMS < lo || s.Error != "" {
			t.Errorf("session %d started at %.1f ms (error %q), want ≥ %.0f ms", i, s.StartMS, s.Error, lo)
		}
	}
	if _, err := bench.Load(context.Background(), instantTarget{}, bench.LoadOptions{Sessions: 2, Ramp: -time.Second}); err == nil {
		t.Error("a negative ramp was accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	rep, err = bench.Load(ctx, instantTarget{}, bench.LoadOptions{Sessions: 2, ClipSeconds: 0.5, Ramp: time.Hour})
	if err == nil || rep.Failed != 1 || !strings.Contains(rep.PerSession[1].Error, "deadline") {
		t.Errorf("cancelled during the ramp: err %v, %d failed, session 1 %+v", err, rep.Failed, rep.PerSession[1])
	}
}
