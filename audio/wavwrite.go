package audio

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// wavHeaderSize is the size of a canonical 16-bit PCM WAV header.
const wavHeaderSize = 44

// PCM16 converts one sample as liquid-audio's demo converts its replies,
// `(x * 32_767).astype(np.int16)`: the product is taken in float32 and
// truncated toward zero. The input is first clipped to [-1, 1] (numpy's cast
// of an out-of-range value is undefined and wraps in practice; this never
// wraps), and NaN maps to 0.
func PCM16(x float32) int16 {
	switch {
	case x != x: // NaN
		return 0
	case x > 1:
		x = 1
	case x < -1:
		x = -1
	}
	return int16(float32(x * 32767)) // Go's float-to-int conversion truncates toward zero
}

// PCM16LE returns samples as 16-bit little-endian PCM (see PCM16).
func PCM16LE(samples []float32) []byte {
	b := make([]byte, 2*len(samples))
	for i, x := range samples {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(PCM16(x)))
	}
	return b
}

// WAVHeader returns the 44-byte header of a mono 16-bit PCM WAV holding n
// samples. A negative n gives a streaming header whose RIFF and data sizes
// are 0xFFFFFFFF (read to EOF), for replies whose length is not known yet;
// a length that does not fit the 32-bit size fields gets the same.
func WAVHeader(sampleRate, n int) []byte {
	h := make([]byte, wavHeaderSize)
	le := binary.LittleEndian
	riff, data := uint32(math.MaxUint32), uint32(math.MaxUint32)
	if n >= 0 && uint64(n)*2+wavHeaderSize-8 <= math.MaxUint32 {
		data = uint32(2 * n)
		riff = data + wavHeaderSize - 8
	}
	copy(h[0:], "RIFF")
	le.PutUint32(h[4:], riff)
	copy(h[8:], "WAVEfmt ")
	le.PutUint32(h[16:], 16)
	le.PutUint16(h[20:], tagPCM)
	le.PutUint16(h[22:], 1) // mono
	le.PutUint32(h[24:], uint32(sampleRate))
	le.PutUint32(h[28:], uint32(2*sampleRate)) // bytes per second
	le.PutUint16(h[32:], 2)                    // block align
	le.PutUint16(h[34:], 16)                   // bits per sample
	copy(h[36:], "data")
	le.PutUint32(h[40:], data)
	return h
}

// WriteWAV writes samples as a mono 16-bit PCM WAV (see PCM16).
func WriteWAV(w io.Writer, sampleRate int, samples []float32) error {
	if sampleRate < MinSampleRate || sampleRate > MaxSampleRate {
		return fmt.Errorf("write wav: sample rate %d Hz (want %d..%d)", sampleRate, MinSampleRate, MaxSampleRate)
	}
	if uint64(len(samples))*2+wavHeaderSize-8 > math.MaxUint32 {
		return fmt.Errorf("write wav: %d samples do not fit a RIFF file", len(samples))
	}
	if _, err := w.Write(WAVHeader(sampleRate, len(samples))); err != nil {
		return fmt.Errorf("write wav header: %w", err)
	}
	if _, err := w.Write(PCM16LE(samples)); err != nil {
		return fmt.Errorf("write wav data: %w", err)
	}
	return nil
}
