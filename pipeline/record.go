package pipeline

import (
	"fmt"
	"math"
	"os"
	"sort"
	"sync"

	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// Recorder collects every intermediate a turn computes, under the tensor
// names, dtypes and layouts of the reference case files (see
// testdata/lfm2-audio-tiny/README.md), so that a dump and a reference file
// compare name by name. Step arrays hold the engine's own picks and margins
// (also when a Teacher replaced what was fed back).
type Recorder struct {
	mu      sync.Mutex
	floats  map[string]recorded[float32]
	ints    map[string]recorded[int]
	steps   []stepRecord
	cb      int
	nAudio  int // audio steps so far (for mimi_frame_idx)
	frameIx []int
	frames  [][]int
	wav     []float32
	dirty   bool // steps or frames were added since the last assemble
}

type recorded[T any] struct {
	v     []T
	shape []int
}

type stepRecord struct {
	mod          int
	yielded      int
	token        int
	codes        []int
	hidden       []float32
	textMargin   float32
	audioMargins []float32
	textLogits   []float32
	audioLogits  [][]float32
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{floats: map[string]recorded[float32]{}, ints: map[string]recorded[int]{}}
}

// SetFloats records a float tensor (stored as F32).
func (r *Recorder) SetFloats(name string, v []float32, shape ...int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.floats[name] = recorded[float32]{append([]float32(nil), v...), shape}
}

// SetInts records an integer tensor (stored as I64).
func (r *Recorder) SetInts(name string, v []int, shape ...int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ints[name] = recorded[int]{append([]int(nil), v...), shape}
}

// Floats returns a recorded float tensor (step arrays included once
// Tensors or Floats has assembled them).
func (r *Recorder) Floats(name string) ([]float32, []int, bool) {
	r.assemble()
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.floats[name]
	return t.v, t.shape, ok
}

// Ints returns a recorded integer tensor.
func (r *Recorder) Ints(name string) ([]int, []int, bool) {
	r.assemble()
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.ints[name]
	return t.v, t.shape, ok
}

func (r *Recorder) textStep(hidden, logits []float32, pick int, yielded bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirty = true
	y := 0
	if yielded {
		y = 1
	}
	r.steps = append(r.steps, stepRecord{mod: 1, yielded: y, token: pick, hidden: hidden,
		textMargin: float32(numcmp.Margin(logits)), textLogits: append([]float32(nil), logits...)})
}

func (r *Recorder) audioStep(hidden []float32, picks []int, logits [][]float32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirty = true
	m := make([]float32, len(logits))
	for i, l := range logits {
		m[i] = float32(numcmp.Margin(l))
	}
	r.cb = len(picks)
	r.steps = append(r.steps, stepRecord{mod: 3, yielded: 1, token: -1, codes: append([]int(nil), picks...),
		hidden: hidden, audioMargins: m, audioLogits: logits})
}

// decoded records a frame handed to the codec (its index among the turn's
// audio steps) and the samples it became.
func (r *Recorder) decoded(audioStep int, codes []int, pcm []float32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirty = true
	r.frameIx = append(r.frameIx, audioStep)
	r.frames = append(r.frames, append([]int(nil), codes...))
	r.wav = append(r.wav, pcm...)
}

// flushed records the samples the codec held back until the turn's end.
func (r *Recorder) flushed(pcm []float32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirty = true
	r.wav = append(r.wav, pcm...)
}

// assemble turns the step records into the reference's step arrays, once
// per change.
func (r *Recorder) assemble() {
	r.mu.Lock()
	defer r.mu.Unlock()
	S := len(r.steps)
	if S == 0 || !r.dirty {
		return
	}
	r.dirty = false
	cb := r.cb
	if cb == 0 {
		cb = 8
	}
	H := 0
	for _, s := range r.steps {
		H = max(H, len(s.hidden))
	}
	mod, yielded, tok := make([]int, S), make([]int, S), make([]int, S)
	codes := make([]int, S*cb)
	hidden := make([]float32, S*H)
	tm := make([]float32, S)
	am := make([]float32, S*cb)
	nan := float32(math.NaN())
	var textIdx, audioIdx []int
	var textLogits, audioLogits []float32
	V, AV := 0, 0
	for i, s := range r.steps {
		mod[i], yielded[i], tok[i] = s.mod, s.yielded, s.token
		copy(hidden[i*H:], s.hidden)
		tm[i] = nan
		for c := 0; c < cb; c++ {
			codes[i*cb+c] = -1
			am[i*cb+c] = nan
		}
		if s.mod == 1 {
			tm[i] = s.textMargin
			textIdx = append(textIdx, i)
			textLogits = append(textLogits, s.textLogits...)
			V = len(s.textLogits)
		} else {
			copy(codes[i*cb:], s.codes)
			copy(am[i*cb:], s.audioMargins)
			audioIdx = append(audioIdx, i)
			for _, l := range s.audioLogits {
				audioLogits = append(audioLogits, l...)
				AV = len(l)
			}
		}
	}
	r.ints["step_modality"] = recorded[int]{mod, []int{S}}
	r.ints["step_yielded"] = recorded[int]{yielded, []int{S}}
	r.ints["step_text_token"] = recorded[int]{tok, []int{S}}
	r.ints["step_codes"] = recorded[int]{codes, []int{S, cb}}
	r.floats["step_hidden"] = recorded[float32]{hidden, []int{S, H}}
	r.floats["step_text_margin"] = recorded[float32]{tm, []int{S}}
	r.floats["step_audio_margin"] = recorded[float32]{am, []int{S, cb}}
	r.ints["text_logits_step_idx"] = recorded[int]{textIdx, []int{len(textIdx)}}
	r.floats["text_logits"] = recorded[float32]{textLogits, []int{len(textIdx), V}}
	r.ints["audio_logits_step_idx"] = recorded[int]{audioIdx, []int{len(audioIdx)}}
	r.floats["audio_logits"] = recorded[float32]{audioLogits, []int{len(audioIdx), cb, AV}}
	T := len(r.frames)
	mc := make([]int, cb*T)
	for f, fr := range r.frames {
		for c, v := range fr {
			mc[c*T+f] = v
		}
	}
	r.ints["mimi_codes"] = recorded[int]{mc, []int{cb, T}}
	r.ints["mimi_frame_idx"] = recorded[int]{append([]int(nil), r.frameIx...), []int{T}}
	r.floats["wav_mimi_stream"] = recorded[float32]{append([]float32(nil), r.wav...), []int{1, len(r.wav)}}
}

// Tensors returns everything recorded as safetensors tensors.
func (r *Recorder) Tensors() []*safetensors.Tensor {
	r.assemble()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*safetensors.Tensor
	names := make([]string, 0, len(r.floats)+len(r.ints))
	for n := range r.floats {
		names = append(names, n)
	}
	for n := range r.ints {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if f, ok := r.floats[n]; ok {
			out = append(out, safetensors.NewF32(n, f.v, f.shape...))
			continue
		}
		iv := r.ints[n]
		v := make([]int64, len(iv.v))
		for i, x := range iv.v {
			v[i] = int64(x)
		}
		out = append(out, safetensors.NewI64(n, v, iv.shape...))
	}
	return out
}

// WriteFile writes the recording as a safetensors file.
func (r *Recorder) WriteFile(path string, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := safetensors.Write(f, r.Tensors(), metadata); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
