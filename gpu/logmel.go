package gpu

// LogMelSpec is what a log-mel front end computes, as constants a device
// can run (package audio's LogMel.DeviceSpec builds it; its Compute is the
// definition): STFT frames of NFFT points every Hop samples, centred with
// zero padding, the window's nonzero span [WinLo, WinHi) of Window, a
// radix-2 FFT in float64 on the host plan's twiddles and bit-reversal
// swaps, NeMo's power |X|², the mel filterbank's nonzero span of each
// filter summed in float64, log(v + LogGuard) when Log, and NeMo's
// per_feature normalisation (std + StdGuard) with the frames from the
// last valid one on set to PadValue. A spec is immutable once built:
// devices may keep a copy of its tables.
type LogMelSpec struct {
	NFFT, Hop    int
	WinLo, WinHi int
	Window       []float32 // NFFT entries
	// Twiddles is the FFT plan's table, NFFT complex values as (re, im)
	// pairs: stage s reads entries s/2 … s−1.
	Twiddles []float64
	Swaps    []int32 // bit-reversal transpositions, (i, j) pairs flattened
	Mels     int
	FB       []float32 // Mels × (NFFT/2+1), row-major
	FBLo     []int32   // each filter's first nonzero bin
	FBHi     []int32   // one past its last
	Log      bool
	LogGuard float32
	StdGuard float32
	PadValue float32
}

// LogMeler is a Queue that computes a log-mel front end on the device.
//
// LogMel writes into dst (F32 [rows, spec.Mels], rows ≥ frames ≥ valid ≥
// 2) the features of the pre-emphasised samples x (F32 [1, n]): frames
// STFT frames, each normalised per feature over the first valid, and the
// rows from valid on set to spec.PadValue — the floats of package audio's
// LogMel.Compute, up to the last bit of a float64 log (see there).
type LogMeler interface {
	LogMel(dst, x Tensor, spec *LogMelSpec, frames, valid int)
}
