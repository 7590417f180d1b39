package pipeline

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

// scripted is a toy family: its backbone's logits say the next token of a
// script, its audio head the next frame, its codec decodes a frame to
// FrameSamples copies of its first code. It shares no code with LFM2-Audio,
// so a turn through it shows that the engine needs only the interface.
type scripted struct {
	tok  *tokenizer.Tokenizer
	info family.Info

	mu     sync.Mutex
	text   []int   // the text steps' tokens, in order
	frames [][]int // the audio steps' frames, in order
	rows   []int   // the rows of each Forward call
	freed  int     // caches freed
}

const scriptedArch = "ScriptedSpeechForTesting"

var registerScripted sync.Once

// loadScripted registers the toy family and loads it through family.Load
// from a folder whose config.json names it.
func loadScripted(t *testing.T, text []string, frames [][]int) (*scripted, gpu.Device) {
	t.Helper()
	registerScripted.Do(func() {
		family.Register(scriptedArch, func(dev gpu.Device, dir string, opts family.Options) (family.Model, error) {
			data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				return nil, err
			}
			tok, err := tokenizer.Parse(data)
			if err != nil {
				return nil, err
			}
			return &scripted{tok: tok}, nil
		})
	})
	dir := t.TempDir()
	tokData, err := os.ReadFile(filepath.Join(tinyModel, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"config.json":    []byte(`{"architectures": ["` + scriptedArch + `"], "model_type": "scripted"}`),
		"tokenizer.json": tokData,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dev := cpu.New(0)
	fm, err := family.Load(dev, dir, family.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := fm.(*scripted)
	id := func(s string) int {
		v, ok := m.tok.TokenID(s)
		if !ok {
			t.Fatalf("no %s token", s)
		}
		return v
	}
	m.info = family.Info{
		Name: "scripted", Family: "scripted",
		HiddenSize: 4, VocabSize: m.tok.VocabSize(), Codebooks: 2,
		InterleavedText: 2, InterleavedAudio: 3,
		Special: family.Special{IMEnd: id("<|im_end|>"), AudioStart: id("<|audio_start|>"), TextEnd: id("<|text_end|>"), EOA: 16},
	}
	for _, s := range text {
		if v, ok := m.tok.TokenID(s); ok {
			m.text = append(m.text, v)
		} else {
			m.text = append(m.text, m.tok.Encode(s)...)
		}
	}
	m.frames = frames
	t.Cleanup(func() { m.Close(); dev.Close() })
	return m, dev
}

func (m *scripted) Info() family.Info               { return m.info }
func (m *scripted) Tokenizer() *tokenizer.Tokenizer { return m.tok }
func (m *scripted) Template() family.Template       { return scriptedTemplate }
func (m *scripted) Frontend() family.Frontend       { return scriptedFront{} }
func (m *scripted) LM() family.Backbone             { return scriptedLM{m} }
func (m *scripted) Head() family.AudioHead          { return scriptedHead{m} }
func (m *scripted) AudioCodec() family.Codec        { return scriptedCodec{} }
func (m *scripted) Close() error                    { return nil }

func (m *scripted) forwardRows() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.rows)
}

func (m *scripted) freedCaches() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.freed
}

func oneHot(n, hot int) []float32 {
	v := make([]float32, n)
	v[hot] = 1
	return v
}

// scriptedTemplate frames the toy family's conversations as ChatML after
// <|endoftext|>, with its own default prompts.
var scriptedTemplate = family.ChatML{BOS: "<|endoftext|>", Prompts: map[family.Mode]string{
	family.Interleaved: "Follow the script.", family.Sequential: "Read the script.",
}}

// scriptedFront is never used: the test's turn is text only.
type scriptedFront struct{}

func (scriptedFront) SampleRate() int                  { return 16000 }
func (scriptedFront) Frames(n int) (frames, valid int) { return n / 160, n / 160 }
func (scriptedFront) Features([]float32) (*audio.Features, error) {
	return nil, errors.New("scripted family: no audio input")
}
func (scriptedFront) Encode(_ *nn.Ctx, feats gpu.Tensor) gpu.Tensor { return feats }
func (scriptedFront) Adapt(_ *nn.Ctx, enc gpu.Tensor) gpu.Tensor    { return enc }

type scriptedCache struct{ m *scripted }

func (c scriptedCache) Free() { c.m.mu.Lock(); c.m.freed++; c.m.mu.Unlock() }

type scriptedLM struct{ m *scripted }

func (b scriptedLM) NewCache(gpu.Device) family.Cache { return scriptedCache{b.m} }
func (b scriptedLM) EmbedTokens(c *nn.Ctx, dst gpu.Tensor, ids []int32) {
	c.Q.Write(dst, make([]float32, dst.Len()))
}
func (b scriptedLM) Forward(c *nn.Ctx, x gpu.Tensor, seqs []family.Seq) gpu.Tensor {
	b.m.mu.Lock()
	defer b.m.mu.Unlock()
	for _, s := range seqs {
		if _, ok := s.Cache.(scriptedCache); !ok {
			panic("a cache from another backbone")
		}
		b.m.rows = append(b.m.rows, s.Rows)
	}
	return x
}
func (b scriptedLM) Logits(c *nn.Ctx, dst, h gpu.Tensor) {
	b.m.mu.Lock()
	defer b.m.mu.Unlock()
	for r := range h.Rows {
		next := b.m.text[0]
		b.m.text = b.m.text[1:]
		c.Q.Write(dst.Row(r), oneHot(dst.Cols, next))
	}
}

type scriptedHead struct{ m *scripted }

func (h scriptedHead) Frame(c *nn.Ctx, x gpu.Tensor, pick family.Picker) ([][]int, error) {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	codes := make([][]int, x.Rows)
	for r := range codes {
		want := h.m.frames[0]
		h.m.frames = h.m.frames[1:]
		for i, code := range want {
			codes[r] = append(codes[r], pick(r, i, oneHot(h.m.info.Special.EOA+1, code)))
		}
	}
	return codes, nil
}
func (h scriptedHead) EmbedFrames(c *nn.Ctx, dst gpu.Tensor, frames [][]int) {
	c.Q.Write(dst, make([]float32, dst.Len()))
}

type scriptedCodec struct{}

func (scriptedCodec) Kind() string      { return "scripted" }
func (scriptedCodec) SampleRate() int   { return 8000 }
func (scriptedCodec) FrameSamples() int { return 4 }
func (scriptedCodec) Codebooks() int    { return 2 }
func (scriptedCodec) Lag() int          { return 0 }
func (c scriptedCodec) Decode(ctx context.Context, codes [][]int) ([]float32, error) {
	return scriptedStream{}.DecodeFrames(ctx, codes)
}
func (scriptedCodec) NewStream() family.CodecStream { return scriptedStream{} }
func (scriptedCodec) Close() error                  { return nil }

type scriptedStream struct{}

func (scriptedStream) DecodeFrames(_ context.Context, codes [][]int) ([]float32, error) {
	var pcm []float32
	for _, f := range codes {
		for range 4 {
			pcm = append(pcm, float32(f[0]))
		}
	}
	return pcm, nil
}
func (scriptedStream) Flush() []float32 { return nil }
func (scriptedStream) Close()           {}

// TestScriptedFamily: a family registered under its own architecture
// name, loaded by family.Load from its config.json, runs a sequential
// turn through the unchanged engine: its text, its frames decoded by its
// codec (the end-of-audio frame fed back but not decoded), a prefill and
// then one row per step, its cache freed with the session.
func TestScriptedFamily(t *testing.T) {
	m, dev := loadScripted(t, []string{"Hi", "<|audio_start|>", "<|im_end|>"}, [][]int{{1, 2}, {3, 4}, {16, 5}})
	e := New(m, dev, Options{})
	defer e.Close()
	if got := e.Model().Info().Family; got != "scripted" {
		t.Errorf("engine's model family %q, want scripted", got)
	}
	s := e.NewSession()
	st, err := e.Start(context.Background(), s, Request{Text: "hello", Mode: Sequential})
	if err != nil {
		t.Fatal(err)
	}
	c := collect(t, st, 5*time.Second)
	if c.err != nil {
		t.Fatal(c.err)
	}
	if c.done == nil || c.done.Stop != EndOfTurn {
		t.Fatalf("done %+v, want an end of turn", c.done)
	}
	if want := m.tok.Decode(m.tok.Encode("Hi")); c.text != want {
		t.Errorf("text %q, want %q", c.text, want)
	}
	want := [][]float32{{1, 1, 1, 1}, {3, 3, 3, 3}}
	if !slices.EqualFunc(c.audio, want, slices.Equal) {
		t.Errorf("audio %v, want %v (the end-of-audio frame is not decoded)", c.audio, want)
	}
	if c.done.Timings.Frames != 3 {
		t.Errorf("%d frames, want 3", c.done.Timings.Frames)
	}
	// The conversation is framed by the family's template, with its
	// default prompt of the mode.
	tmpl := scriptedTemplate
	prompt := m.tok.Encode(tmpl.Begin() + tmpl.TurnStart(family.System) + "Read the script." + tmpl.TurnEnd() +
		tmpl.TurnStart(family.User) + "hello" + tmpl.TurnEnd() + tmpl.TurnStart(family.Assistant))
	if got := s.chat.TextIDs(); len(got) < len(prompt) || !slices.Equal(got[:len(prompt)], prompt) {
		t.Errorf("prompt ids %v, want %v first", got, prompt)
	}
	rows := m.forwardRows()
	// Text steps: len(Encode("Hi")) + <|audio_start|> + <|im_end|>; audio
	// steps: 3; the last text step's token is not fed back.
	steps := len(m.tok.Encode("Hi")) + 2 + 3
	if len(rows) != steps || rows[0] < 2 || slices.ContainsFunc(rows[1:], func(n int) bool { return n != 1 }) {
		t.Errorf("forward rows %v: want a prefill then %d single-row steps", rows, steps-1)
	}
	s.Close()
	if n := m.freedCaches(); n != 1 {
		t.Errorf("%d caches freed after the session closed, want 1", n)
	}
}
