package audio

import "math"

// Slaney mel scale (librosa's htk=False): linear below 1 kHz, logarithmic
// above. Variables, not constants, so that they are rounded step by step in
// float64 as librosa computes them (Go would fold constants exactly).
var (
	slaneyFSP       = 200.0 / float64(3) // Hz per mel in the linear part
	slaneyMinLogHz  = 1000.0
	slaneyMinLogMel = (slaneyMinLogHz - 0) / slaneyFSP
	slaneyLogStep   = math.Log(6.4) / 27.0
)

func hzToMelSlaney(f float64) float64 {
	if f >= slaneyMinLogHz {
		return slaneyMinLogMel + math.Log(f/slaneyMinLogHz)/slaneyLogStep
	}
	return (f - 0) / slaneyFSP
}

func melToHzSlaney(m float64) float64 {
	if m >= slaneyMinLogMel {
		return slaneyMinLogHz * math.Exp(slaneyLogStep*(m-slaneyMinLogMel))
	}
	return 0 + slaneyFSP*m
}

// melFilterbank returns librosa.filters.mel(sr=sr, n_fft=nFFT, n_mels=nMels,
// fmin=fmin, fmax=fmax, htk=False, norm="slaney", dtype=float32) as a
// row-major [nMels, nFFT/2+1] matrix, with librosa 0.11.0's arithmetic: the
// triangles in float64 stored to float32, then scaled in place by the
// float64 Slaney norm (so each weight is rounded twice, as numpy does).
func melFilterbank(sr, nFFT, nMels int, fmin, fmax float64) []float32 {
	nBins := nFFT/2 + 1
	// np.fft.rfftfreq(n_fft, d=1/sr): arange(nBins) * (1 / (n_fft * (1/sr)))
	val := 1.0 / (float64(nFFT) * (1.0 / float64(sr)))
	fftFreqs := make([]float64, nBins)
	for i := range fftFreqs {
		fftFreqs[i] = float64(i) * val
	}
	// mel_frequencies: np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n+2),
	// i.e. i*step + start with the last point set to stop, then mel_to_hz.
	nPts := nMels + 2
	minMel, maxMel := hzToMelSlaney(fmin), hzToMelSlaney(fmax)
	step := (maxMel - minMel) / float64(nPts-1)
	melF := make([]float64, nPts)
	for i := range melF {
		m := float64(float64(i)*step) + minMel
		if i == nPts-1 {
			m = maxMel
		}
		melF[i] = melToHzSlaney(m)
	}
	w := make([]float32, nMels*nBins)
	for i := range nMels {
		fdiffLo := melF[i+1] - melF[i]
		fdiffHi := melF[i+2] - melF[i+1]
		enorm := 2.0 / (melF[i+2] - melF[i])
		for k, f := range fftFreqs {
			lower := -(melF[i] - f) / fdiffLo
			upper := (melF[i+2] - f) / fdiffHi
			v := float32(max(0, min(lower, upper)))
			w[i*nBins+k] = float32(float64(v) * enorm)
		}
	}
	return w
}
