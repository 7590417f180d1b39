// Package device is omni-pipe's sound-card edge: a microphone (Source) and a
// loudspeaker (Sink), real or simulated.
//
//   - Capture records from a PulseAudio (or PipeWire-Pulse) server with the
//     pure-Go github.com/jfreymuth/pulse client, in fixed-size chunks of mono
//     float32 PCM at 16 kHz or the device's own rate.
//   - Player plays mono PCM through github.com/ebitengine/oto/v3 (PulseAudio,
//     falling back to ALSA), or straight to a named PulseAudio sink, behind a
//     small jitter buffer; Flush drops what is queued at once (barge-in).
//   - FileSource reads a WAV file as if it were a microphone, paced in real
//     time or as fast as its reader takes it; Recorder is a Sink that keeps
//     what it is given. With them, everything above this package runs
//     without a sound card.
//
// Nothing here needs cgo: ALSA is loaded at run time (purego) by oto only
// when no PulseAudio server answers.
package device

import (
	"errors"
	"fmt"
	"time"
)

// Source is a microphone: mono float32 PCM in chunks.
type Source interface {
	// SampleRate of the chunks, in Hz.
	SampleRate() int
	// Chunks delivers the audio. It is closed at the end of the input, on
	// a device error, and after Close. A chunk stays valid and must not be
	// modified.
	Chunks() <-chan []float32
	// Err reports why Chunks was closed: nil at the end of a file or
	// after Close.
	Err() error
	// Close stops the source and waits for its goroutines to end.
	Close() error
}

// Sink is a loudspeaker: mono float32 PCM in, played in order.
type Sink interface {
	// SampleRate the sink plays at, in Hz.
	SampleRate() int
	// Write queues pcm and returns without waiting for it to play.
	Write(pcm []float32) error
	// Flush drops every queued sample at once (barge-in).
	Flush()
	// Queued returns the audio written but not played yet.
	Queued() time.Duration
}

// ErrNoAudioServer is wrapped by the errors of Capture, Player and List
// when no sound server or device could be opened.
var ErrNoAudioServer = errors.New("no audio server reachable")

// noServer wraps a connection failure with what to do about it.
func noServer(what string, err error) error {
	return fmt.Errorf("%s: %w: %v\n"+
		"  omni-pipe talks to a PulseAudio server (PipeWire's pipewire-pulse works too): start one, or point\n"+
		"  PULSE_SERVER at it (e.g. unix:/run/user/1000/pulse/native). Playback without PulseAudio falls back\n"+
		"  to ALSA (libasound.so.2). On a machine without sound: 'pulseaudio -n --daemonize=no\n"+
		"  -L module-native-protocol-unix -L module-null-sink' (docs/mic.md), or use --wav FILE / --out FILE",
		what, ErrNoAudioServer, err)
}

// samples converts a duration to a sample count at rate, rounding down.
func samples(d time.Duration, rate int) int {
	return int(int64(d) * int64(rate) / int64(time.Second))
}

// duration converts a sample count at rate to a duration.
func duration(n int64, rate int) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(n * int64(time.Second) / int64(rate))
}
