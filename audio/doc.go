// Package audio is omni-pipe's audio edge: WAV decoding of what clients send
// and 16-bit WAV encoding of replies, resampling to the model's rate exactly
// as torchaudio.functional.resample does it, and the log-mel front end of
// LFM2-Audio (NeMo's AudioToMelSpectrogramPreprocessor, in float32).
//
// The numerics follow the reference's float32 dtype path step by step
// (liquid-audio's: torchaudio's resample, then NeMo's preprocessor in eval
// mode), so that the features fed to the encoder
// match liquid-audio's to float32 rounding. The usual flow is
//
//	clip, err := audio.DecodeBytes(body, audio.DecodeOptions{MaxDuration: time.Minute})
//	mel, err := audio.NewLogMel(cfg.Preprocessor, audio.LogMelOptions{RoundBF16: true})
//	feats, err := mel.ComputeClip(clip) // resamples to 16 kHz when needed
//	// feats.Data is [feats.Frames, feats.Bins], time-major.
package audio
