package audio_test

import (
	"bytes"
	"fmt"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/stages/config"
)

// A 24 kHz reply written as WAV, read back, and turned into encoder
// features at 16 kHz.
func Example() {
	samples := make([]float32, 24000) // 1 s of silence at 24 kHz
	var wav bytes.Buffer
	if err := audio.WriteWAV(&wav, 24000, samples); err != nil {
		panic(err)
	}
	clip, err := audio.DecodeBytes(wav.Bytes(), audio.DecodeOptions{MaxDuration: time.Minute})
	if err != nil {
		panic(err)
	}
	mel, err := audio.NewLogMel(config.Preprocessor{
		SampleRate: 16000, Normalize: "per_feature", WindowSize: 0.025, WindowStride: 0.01,
		Window: "hann", Features: 128, NFFT: 512, Log: true, FrameSplicing: 1,
	}, audio.LogMelOptions{RoundBF16: true})
	if err != nil {
		panic(err)
	}
	feats, err := mel.ComputeClip(clip)
	if err != nil {
		panic(err)
	}
	fmt.Println(clip.SampleRate, len(clip.Samples), feats.Frames, feats.Valid, feats.Bins)
	// Output: 24000 24000 101 100 128
}
