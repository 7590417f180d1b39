// Package refcase reads the reference case files made with the official
// code (testdata/lfm2-audio-tiny/case*.safetensors, or any file in that
// format): the conversation and settings recorded in the safetensors
// metadata, the input audio, the recorded traces and every intermediate.
package refcase

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// Case is an open reference file.
type Case struct {
	Path   string
	F      *safetensors.File
	System string
	Turns  []Turn
	Gen    Generation
}

// Turn is one recorded turn of the conversation before the assistant turn
// the file's traces belong to.
type Turn struct {
	Role  string `json:"role"`
	Audio string `json:"audio,omitempty"` // tensor holding the user's waveform
	Text  string `json:"text,omitempty"`
	Trace string `json:"trace,omitempty"` // "turn1_step_*": an assistant turn's recorded trace
}

// Generation holds the recorded generation settings.
type Generation struct {
	Mode         string `json:"mode"`
	MaxNewTokens int    `json:"max_new_tokens"`
	Text         string `json:"text"`  // "greedy" or a sampling description
	Audio        string `json:"audio"` // likewise
	NText        int    `json:"interleaved_n_text"`
	NAudio       int    `json:"interleaved_n_audio"`
}

// Open reads a case file and its metadata.
func Open(path string) (*Case, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	c := &Case{Path: path, F: f}
	md := f.Metadata
	if md == nil || md["turns"] == "" {
		f.Close()
		return nil, fmt.Errorf("%s: no recorded conversation in the metadata (not a reference case file?)", path)
	}
	c.System = md["system"]
	if err := json.Unmarshal([]byte(md["turns"]), &c.Turns); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: metadata turns: %w", path, err)
	}
	if g := md["generation"]; g != "" {
		if err := json.Unmarshal([]byte(g), &c.Gen); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: metadata generation: %w", path, err)
		}
	}
	return c, nil
}

// OpenTensors opens a file of reference tensors without a recorded
// conversation (such as a float64 companion).
func OpenTensors(path string) (*Case, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	return &Case{Path: path, F: f}, nil
}

// Close releases the file.
func (c *Case) Close() error { return c.F.Close() }

// Has reports whether the file holds the tensor.
func (c *Case) Has(name string) bool { return c.F.Tensor(name) != nil }

// Floats returns a tensor's values as float32.
func (c *Case) Floats(name string) ([]float32, error) {
	t, err := c.F.Lookup(name)
	if err != nil {
		return nil, err
	}
	return t.Float32s()
}

// Ints returns an integer tensor's values.
func (c *Case) Ints(name string) ([]int, error) {
	t, err := c.F.Lookup(name)
	if err != nil {
		return nil, err
	}
	v, err := t.Int64s()
	if err != nil {
		return nil, err
	}
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out, nil
}

// Shape returns a tensor's shape.
func (c *Case) Shape(name string) []int {
	if t := c.F.Tensor(name); t != nil {
		return t.Shape
	}
	return nil
}

// Clip returns a recorded waveform (e.g. "input_wav") at input_sample_rate.
func (c *Case) Clip(name string) (*audio.Clip, error) {
	wav, err := c.Floats(name)
	if err != nil {
		return nil, err
	}
	rate, err := c.Ints("input_sample_rate")
	if err != nil {
		return nil, err
	}
	return &audio.Clip{SampleRate: rate[0], Samples: wav}, nil
}

// Trace is a recorded assistant turn: one entry per backbone step.
type Trace struct {
	Modality []int   // 1 text, 3 audio
	Yielded  []int   // 1 if the reference yielded the step's output
	Tokens   []int   // text token, -1 on audio steps
	Codes    [][]int // the frame as yielded, nil on text steps
}

// Trace reads the trace with the given prefix: "" for the file's own turn
// (step_*), or a metadata trace name such as "turn1_step_*".
func (c *Case) Trace(prefix string) (*Trace, error) {
	prefix = strings.TrimSuffix(prefix, "step_*")
	var tr Trace
	var err error
	if tr.Modality, err = c.Ints(prefix + "step_modality"); err != nil {
		return nil, err
	}
	if tr.Yielded, err = c.Ints(prefix + "step_yielded"); err != nil {
		return nil, err
	}
	if tr.Tokens, err = c.Ints(prefix + "step_text_token"); err != nil {
		return nil, err
	}
	codes, err := c.Ints(prefix + "step_codes")
	if err != nil {
		return nil, err
	}
	n := len(tr.Modality)
	if len(tr.Yielded) != n || len(tr.Tokens) != n || n == 0 || len(codes)%n != 0 {
		return nil, fmt.Errorf("%s: trace %q has inconsistent lengths", c.Path, prefix)
	}
	cb := len(codes) / n
	tr.Codes = make([][]int, n)
	for s := range n {
		if tr.Modality[s] == 3 {
			tr.Codes[s] = codes[s*cb : (s+1)*cb]
		}
	}
	return &tr, nil
}

// Steps returns the number of steps.
func (t *Trace) Steps() int { return len(t.Modality) }
