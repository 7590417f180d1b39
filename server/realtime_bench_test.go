package server

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu/devices"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// startBenchServer is startServer on the model and device the environment
// names (OMNIPIPE_BENCH_MODEL, OMNIPIPE_BENCH_DEVICE), else the tiny model
// on the CPU.
func startBenchServer(b *testing.B) *testServer {
	dir, kind := os.Getenv("OMNIPIPE_BENCH_MODEL"), os.Getenv("OMNIPIPE_BENCH_DEVICE")
	if dir == "" && kind == "" {
		return startServer(b, Config{})
	}
	if dir == "" {
		dir = tinyModel
	}
	dev, _, err := devices.Open(kind, devices.Options{})
	if err != nil {
		b.Fatal(err)
	}
	m, err := lfm2audio.Load(dev, dir)
	if err != nil {
		b.Fatal(err)
	}
	s := New(Config{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), Version: "bench"})
	eng := pipeline.New(m, dev, pipeline.Options{MaxTurns: s.cfg.MaxConcurrent})
	s.SetBackend(&Backend{Engine: eng, Model: m.Name, Device: dev.Name(), GPU: dev})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ts := &testServer{Server: s, url: "http://" + ln.Addr().String(), eng: eng, logs: &syncBuffer{}, stop: stop,
		served: make(chan error, 1), client: &http.Client{Transport: &http.Transport{}}}
	go func() { ts.served <- s.Serve(ctx, ln) }()
	b.Cleanup(func() {
		stop()
		<-ts.served
		eng.Close()
		m.Close()
		dev.Close()
	})
	return ts
}

// BenchmarkRealtimeSpeechEndToAudio: end of speech (the client receives
// input_audio_buffer.speech_stopped) to the first response.output_audio.delta,
// one spoken turn per iteration in one session (the tiny model, the demo
// model's weights; OMNIPIPE_BENCH_MODEL=DIR and OMNIPIPE_BENCH_DEVICE=cuda
// measure another checkpoint, e.g. the synthetic real-size one, on another
// device). docs/performance.md records it.
func BenchmarkRealtimeSpeechEndToAudio(b *testing.B) {
	ts := startBenchServer(b)
	c := dialRT(b, ts, nil)
	c.send(map[string]any{"type": "session.update", "session": map[string]any{"max_output_tokens": 16}})
	c.until("session.updated")
	speech := utterance(300*time.Millisecond, 1500*time.Millisecond, 700*time.Millisecond)
	var total time.Duration
	for b.Loop() {
		c.appendAudio(speech)
		c.until("input_audio_buffer.speech_stopped")
		start := time.Now()
		c.until("response.output_audio.delta")
		total += time.Since(start)
		c.until("response.done")
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/first-audio")
}
