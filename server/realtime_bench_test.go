package server

import (
	"testing"
	"time"
)

// BenchmarkRealtimeSpeechEndToAudio: end of speech (the client receives
// input_audio_buffer.speech_stopped) to the first response.output_audio.delta,
// one spoken turn per iteration in one session (the tiny model, the demo
// model's weights). docs/performance.md records it.
func BenchmarkRealtimeSpeechEndToAudio(b *testing.B) {
	ts := startServer(b, Config{})
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
