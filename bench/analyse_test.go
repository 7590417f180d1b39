package bench

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func iv(stage string, startMs, endMs float64) pipeline.Interval {
	at := func(v float64) time.Time { return t0.Add(time.Duration(v * float64(time.Millisecond))) }
	return pipeline.Interval{Stage: stage, Start: at(startMs), End: at(endMs)}
}

func TestOverlap(t *testing.T) {
	bb := pipeline.StageBackbone
	tests := []struct {
		name  string
		codec pipeline.Interval
		ivs   []pipeline.Interval
		want  float64
	}{
		{"none", iv("codec", 10, 20), nil, 0},
		{"disjoint", iv("codec", 10, 20), []pipeline.Interval{iv(bb, 0, 10), iv(bb, 20, 30)}, 0},
		{"inside", iv("codec", 10, 20), []pipeline.Interval{iv(bb, 0, 100)}, 10},
		{"two parts", iv("codec", 10, 20), []pipeline.Interval{iv(bb, 5, 12), iv(bb, 18, 25)}, 4},
		{"overlapping intervals count once", iv("codec", 10, 20), []pipeline.Interval{iv(bb, 11, 15), iv(bb, 13, 17), iv(bb, 12, 14)}, 6},
		{"unsorted", iv("codec", 0, 10), []pipeline.Interval{iv(bb, 8, 9), iv(bb, 1, 2)}, 2},
	}
	for _, tt := range tests {
		if got := overlap(tt.codec, tt.ivs); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: overlap %g ms, want %g", tt.name, got, tt.want)
		}
	}
}

// analyse maps the k-th backbone interval to step k and the loop's wall
// time to the span from the prefill's end to the last loop interval.
func TestAnalyse(t *testing.T) {
	ivs := []pipeline.Interval{
		iv(pipeline.StageCodec, 31, 35), // decodes frame 0 while step 3 runs
		iv(pipeline.StageFrontend, 0, 2),
		iv(pipeline.StageEncoder, 2, 5),
		iv(pipeline.StageBackbone, 5, 15), // step 0: prefill
		iv(pipeline.StageBackbone, 16, 18),
		iv(pipeline.StageBackbone, 19, 20), // step 2: audio
		iv(pipeline.StageDepth, 20, 30),
		iv(pipeline.StageBackbone, 31, 32), // step 3: audio
		iv(pipeline.StageDepth, 32, 40),
	}
	kinds := map[int]pipeline.Kind{0: pipeline.TextStep, 1: pipeline.TextStep, 2: pipeline.AudioStep, 3: pipeline.AudioStep}
	tt, err := analyse(ivs, kinds)
	if err != nil {
		t.Fatal(err)
	}
	eq := func(name string, got, want []float64) {
		if len(got) != len(want) {
			t.Errorf("%s = %v, want %v", name, got, want)
			return
		}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-9 {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
	}
	eq("logmel", tt.logmel, []float64{2})
	eq("encoder", tt.encoder, []float64{3})
	eq("prefill", tt.prefill, []float64{10})
	eq("text", tt.text, []float64{2})
	eq("audio", tt.audio, []float64{1, 1})
	eq("depth", tt.depth, []float64{10, 8})
	eq("codec", tt.codec, []float64{4})
	eq("sums", []float64{tt.loopWall, tt.loopBusy, float64(tt.loopSteps), float64(tt.frames), tt.overlapBackbone, tt.overlapLoop},
		[]float64{25, 22, 3, 2, 1, 4})

	if _, err := analyse([]pipeline.Interval{iv(pipeline.StageFrontend, 0, 1)}, nil); err == nil {
		t.Error("a trace without backbone steps was accepted")
	}
}

func TestQuantile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3, 10, 6, 7, 8, 9}
	for _, c := range []struct{ q, want float64 }{{0, 1}, {0.5, 5}, {0.9, 9}, {1, 10}} {
		if got := quantile(v, c.q); got != c.want {
			t.Errorf("quantile(%g) = %g, want %g", c.q, got, c.want)
		}
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile of nothing = %g, want 0", got)
	}
	if v[0] != 5 {
		t.Error("quantile sorted its argument")
	}
}

func TestArgmaxExcept(t *testing.T) {
	logits := []float32{1, 9, 3, 9, 2}
	for _, c := range []struct {
		skip []int
		want int
	}{{nil, 1}, {[]int{1}, 3}, {[]int{1, 3}, 2}, {[]int{0, 1, 2, 3}, 4}} {
		if got := argmaxExcept(logits, c.skip...); got != c.want {
			t.Errorf("argmaxExcept(%v) = %d, want %d", c.skip, got, c.want)
		}
	}
}

// meterDev is a CPU device that reports a device bandwidth.
type meterDev struct {
	gpu.Device
	bps float64
	err error
}

func (m meterDev) MeasureBandwidth() (float64, error) { return m.bps, m.err }

func TestDeviceBandwidth(t *testing.T) {
	cpuDev := cpu.New(1)
	defer cpuDev.Close()
	b := DeviceBandwidth(meterDev{Device: cpuDev, bps: 4.2e12}, 1)
	if b.Device == "" || b.CopyGBs != 4200 || b.ReadGBs != 4200 {
		t.Errorf("a device that measures itself: %+v", b)
	}
	b = DeviceBandwidth(meterDev{Device: cpuDev, err: errors.New("no")}, 1)
	if b.Device != "" || b.CopyGBs <= 0 {
		t.Errorf("a failed device measurement must fall back to the host's: %+v", b)
	}
	if b := DeviceBandwidth(cpuDev, 1); b.Device != "" || b.ReadGBs <= 0 {
		t.Errorf("the CPU device: %+v", b)
	}
}
