package cuda

import (
	"fmt"
	"sync"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// The log-mel front end on the device (gpu.LogMeler): kernels.cu's
// logmel_frames_f32 (a block a pair of STFT frames: window, the host
// plan's FFT in double, power, mel, log) and logmel_norm_f32 (a thread a
// mel bin: NeMo's per_feature normalisation, the padding). A 4.9 s clip
// took 1.2–1.5 ms of an H200 machine's host cores on the host path.

// maxLogMelFFT bounds the device path's FFT: its frames' complex doubles
// and powers must fit a block's 48 KiB of shared memory.
const maxLogMelFFT = 2048

// logmelTables is a spec's tables in device memory.
type logmelTables struct {
	window, tw, swaps, fb, lo, hi gpu.Tensor
}

type logmelCache struct {
	mu sync.Mutex
	m  map[*gpu.LogMelSpec]*logmelTables
}

// logmelTables returns spec's tables on d, loading them at first use.
func (d *Device) logmelTables(s *gpu.LogMelSpec) (*logmelTables, error) {
	c := &d.logmel
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.m[s]; ok {
		return t, nil
	}
	t := &logmelTables{}
	var err error
	load := func(dst *gpu.Tensor, dt gpu.DType, b []byte) {
		if err == nil {
			*dst, err = d.Load(dt, 1, len(b)/4, b)
		}
	}
	swaps := s.Swaps
	if len(swaps) == 0 { // a buffer of one word: the kernel reads none
		swaps = []int32{0}
	}
	load(&t.window, gpu.F32, bytesOf(s.Window))
	load(&t.tw, gpu.I32, bytesOf(s.Twiddles)) // doubles, as pairs of words
	load(&t.swaps, gpu.I32, bytesOf(swaps))
	load(&t.fb, gpu.F32, bytesOf(s.FB))
	load(&t.lo, gpu.I32, bytesOf(s.FBLo))
	load(&t.hi, gpu.I32, bytesOf(s.FBHi))
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[*gpu.LogMelSpec]*logmelTables{}
	}
	c.m[s] = t
	return t, nil
}

// LogMel implements gpu.LogMeler.
func (q *Queue) LogMel(dst, x gpu.Tensor, s *gpu.LogMelSpec, frames, valid int) {
	bins := s.NFFT/2 + 1
	switch {
	case s.NFFT < 4 || s.NFFT > maxLogMelFFT || s.NFFT&(s.NFFT-1) != 0 || s.Hop < 1 || len(s.Window) != s.NFFT ||
		len(s.Twiddles) != 2*s.NFFT || len(s.Swaps)%2 != 0 || len(s.FB) != s.Mels*bins || len(s.FBLo) != s.Mels ||
		len(s.FBHi) != s.Mels:
		panic(fmt.Sprintf("cuda: log-mel spec (n_fft %d, hop %d, %d mels) the device path cannot run", s.NFFT, s.Hop, s.Mels))
	case x.Rows != 1 || dst.Cols != s.Mels || dst.Rows < frames || frames < valid || valid < 2:
		panic(fmt.Sprintf("cuda: log-mel of %v into %v for %d frames, %d valid", x, dst, frames, valid))
	}
	wantF32("logmel", dst, x)
	t, err := q.d.logmelTables(s)
	if err != nil {
		panic(fmt.Sprintf("cuda: log-mel tables: %v", err))
	}
	shm := 2*s.NFFT*8 + 2*bins*4
	q.launch("logmel_frames_f32", [3]uint32{uint32((frames + 1) / 2), 1, 1}, blk256, shm,
		q.t(dst), i(dst.Stride), q.t(x), i(x.Cols), i(frames), i(s.NFFT), i(s.Hop), i(s.WinLo), i(s.WinHi),
		q.t(t.window), q.t(t.tw), q.t(t.swaps), i(len(s.Swaps)/2), q.t(t.lo), q.t(t.hi), q.t(t.fb), i(s.Mels),
		f(s.LogGuard), b2i(s.Log))
	q.launch("logmel_norm_f32", [3]uint32{uint32((s.Mels + 127) / 128), 1, 1}, blk128, 0,
		q.t(dst), i(dst.Stride), i(frames), i(valid), i(dst.Rows), i(s.Mels), f(s.StdGuard), f(s.PadValue))
}
