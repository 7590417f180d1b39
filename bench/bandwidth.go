package bench

import (
	"runtime"

	"github.com/omni-pipe/omni-pipe/gpu"
	"sync"
	"time"
)

// Bandwidth is the machine's measured memory bandwidth.
type Bandwidth struct {
	// CopyGBs is memcpy's rate: bytes copied per second (each read once and
	// written once), in GB/s (10⁹ bytes).
	CopyGBs float64 `json:"copy_gb_s"`
	// ReadGBs is a streaming read's rate (what a GEMV over weights needs).
	ReadGBs float64 `json:"read_gb_s"`
	// Threads is the number of goroutines that shared the work.
	Threads int `json:"threads"`
	// Bytes is the size of the buffer each pass moved.
	Bytes int64 `json:"bytes"`
	// Device names the compute device whose memory was measured ("" for
	// the host's, measured by MeasureBandwidth).
	Device string `json:"device,omitempty"`
}

// DeviceBandwidth returns the memory bandwidth the loop's floors are held
// to on dev: the device's own, where it measures it (a GPU: its copy rate
// counting bytes read and written, as both CopyGBs and ReadGBs), else the
// host's with threads goroutines.
func DeviceBandwidth(dev gpu.Device, threads int) Bandwidth {
	if m, ok := dev.(gpu.BandwidthMeter); ok {
		if bps, err := m.MeasureBandwidth(); err == nil && bps > 0 {
			g := bps / 1e9
			return Bandwidth{CopyGBs: g, ReadGBs: g, Bytes: 512 << 20, Device: dev.Name()}
		}
	}
	return MeasureBandwidth(threads)
}

// bandwidthBytes is far larger than any last-level cache, so passes stream
// from DRAM.
const bandwidthBytes = 256 << 20

// MeasureBandwidth measures memcpy and streaming-read bandwidth with threads
// goroutines (runtime.NumCPU() when ≤ 0) over 256 MB buffers and returns the
// best of five passes of each (the rate the memory system can give; a busy
// machine only lowers it).
func MeasureBandwidth(threads int) Bandwidth {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	const n = bandwidthBytes / 8 // words
	src, dst := make([]uint64, n), make([]uint64, n)
	parallel(threads, func(c int) { // touch every page before timing
		lo, hi := n*c/threads, n*(c+1)/threads
		for i := lo; i < hi; i += 64 {
			src[i], dst[i] = uint64(i), uint64(i>>8)
		}
	})
	best := func(pass func()) time.Duration {
		b := time.Duration(1 << 62)
		for range 5 {
			t := time.Now()
			pass()
			b = min(b, time.Since(t))
		}
		return b
	}
	cp := best(func() {
		parallel(threads, func(c int) {
			lo, hi := n*c/threads, n*(c+1)/threads
			copy(dst[lo:hi], src[lo:hi])
		})
	})
	sums := make([]uint64, threads)
	rd := best(func() {
		parallel(threads, func(c int) {
			lo, hi := n*c/threads, n*(c+1)/threads
			sums[c] = sumWords(src[lo:hi])
		})
	})
	runtime.KeepAlive(sums)
	return Bandwidth{
		CopyGBs: bandwidthBytes / cp.Seconds() / 1e9,
		ReadGBs: bandwidthBytes / rd.Seconds() / 1e9,
		Threads: threads,
		Bytes:   bandwidthBytes,
	}
}

// sumWords reads p once with four independent accumulators.
func sumWords(p []uint64) uint64 {
	var a0, a1, a2, a3 uint64
	i := 0
	for ; i+4 <= len(p); i += 4 {
		a0 += p[i]
		a1 += p[i+1]
		a2 += p[i+2]
		a3 += p[i+3]
	}
	for ; i < len(p); i++ {
		a0 += p[i]
	}
	return a0 + a1 + a2 + a3
}

// parallel runs fn(0 … n−1) on n goroutines and waits.
func parallel(n int, fn func(c int)) {
	var wg sync.WaitGroup
	for c := 1; c < n; c++ {
		wg.Add(1)
		go func() { defer wg.Done(); fn(c) }()
	}
	fn(0)
	wg.Wait()
}
