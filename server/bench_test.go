package server

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkAudioChatStream measures whole streamed turns over HTTP on the
// tiny model (60 steps, spoken question in), with 1 and 4 clients at
// once; it reports the server-side first-audio latency and total time.
func BenchmarkAudioChatStream(b *testing.B) {
	for _, clients := range []int{1, 4} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			ts := startServer(b, Config{MaxConcurrent: clients})
			req := map[string]any{"audio": questionWAV(b), "max_new_tokens": 60, "temperature": 0}
			var mu sync.Mutex
			var firstAudio, total float64
			turns := 0
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := c; i < b.N; i += clients {
						s, _ := streamAudioChat(b, ts, req)
						if s.err != nil {
							b.Error(s.err.Error)
							return
						}
						mu.Lock()
						firstAudio += *s.done.Timings.FirstAudioMS
						total += s.done.Timings.TotalMS
						turns++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(firstAudio/float64(turns), "first-audio-ms")
			b.ReportMetric(total/float64(turns), "turn-ms")
			b.ReportMetric(float64(turns)/time.Since(start).Seconds(), "turns/s")
		})
	}
}
