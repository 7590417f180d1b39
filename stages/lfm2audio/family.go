package lfm2audio

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/conformer"
	"github.com/omni-pipe/omni-pipe/stages/depth"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/lfm2"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

// LFM2-Audio and LFM2.5-Audio checkpoints name the same architecture; the
// folder's codecs tell them apart (see Options).
func init() {
	for _, a := range config.Architectures {
		family.Register(a, loadFamily)
	}
}

var _ family.Model = (*Model)(nil)

// loadFamily is the family's constructor: the folder memory-mapped, or
// read into memory.
func loadFamily(dev gpu.Device, dir string, opts family.Options) (family.Model, error) {
	o := Options{Codec: opts.Codec}
	var m *Model
	var err error
	if opts.InMemory {
		m, err = LoadFSWith(dev, os.DirFS(dir), filepath.Base(filepath.Clean(dir)), o)
	} else {
		m, err = LoadWith(dev, dir, o)
	}
	if err != nil {
		return nil, err
	}
	if opts.Name != "" {
		m.Name = opts.Name
	}
	return m, nil
}

// Info implements family.Model.
func (m *Model) Info() family.Info {
	return family.Info{
		Name: m.Name, Family: m.Family, Params: m.Params,
		HiddenSize: m.Cfg.LFM.HiddenSize, VocabSize: m.Cfg.LFM.VocabSize, Codebooks: m.Cfg.Codebooks,
		InterleavedText: m.Cfg.InterleavedNText, InterleavedAudio: m.Cfg.InterleavedNAudio,
		Special: m.Special,
	}
}

// Tokenizer implements family.Model.
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.Tok }

// The official system prompts of both families (liquid-audio's README).
var officialPrompts = map[family.Mode]string{
	family.Interleaved: "Respond with interleaved text and audio.",
	family.Sequential:  "Perform ASR.",
}

// Templates of the two families: liquid-audio's ChatState layout
// (<|startoftext|>, then "<|im_start|>{role}\n…<|im_end|>\n" turns) with the
// official prompts. LFM2.5-Audio adds its model card's four TTS voices;
// LFM2-Audio's TTS prompt describes a voice in free text ("Perform
// TTS.\nUse the following voice: …"), so it has no preset ones.
var (
	TemplateLFM2Audio  family.Template = family.ChatML{BOS: TokStartOfText, Prompts: officialPrompts}
	TemplateLFM25Audio family.Template = family.ChatML{BOS: TokStartOfText, Prompts: officialPrompts, TTS: []family.Voice{
		{Name: "us_male", Prompt: "Perform TTS. Use the US male voice."},
		{Name: "us_female", Prompt: "Perform TTS. Use the US female voice."},
		{Name: "uk_male", Prompt: "Perform TTS. Use the UK male voice."},
		{Name: "uk_female", Prompt: "Perform TTS. Use the UK female voice."},
	}}
)

// Template implements family.Model: the template of the folder's family.
func (m *Model) Template() family.Template {
	if m.Family == FamilyLFM25Audio {
		return TemplateLFM25Audio
	}
	return TemplateLFM2Audio
}

// Frontend implements family.Model: the log-mel and the FastConformer
// with its adapter.
func (m *Model) Frontend() family.Frontend { return frontend{m.Mel, m.Encoder} }

// LM implements family.Model: the LFM2 backbone.
func (m *Model) LM() family.Backbone { return backbone{m.Backbone} }

// Head implements family.Model: the depthformer and the audio embedding.
func (m *Model) Head() family.AudioHead { return head{m.Depth, m.AudioEmb} }

// AudioCodec implements family.Model: Mimi or the detokenizer.
func (m *Model) AudioCodec() family.Codec { return m.Codec }

type frontend struct {
	mel *audio.LogMel
	enc *conformer.Encoder
}

func (f frontend) SampleRate() int                  { return f.mel.SampleRate() }
func (f frontend) Frames(n int) (frames, valid int) { return f.mel.Frames(n) }
func (f frontend) Features(x []float32) (*audio.Features, error) {
	return f.mel.Compute(x)
}
func (f frontend) Encode(c *nn.Ctx, feats gpu.Tensor) gpu.Tensor { return f.enc.Encode(c, feats) }

// PrepareDevice implements family.DeviceFrontend.
func (f frontend) PrepareDevice(x []float32) (*audio.DeviceInput, error) {
	if f.mel.DeviceSpec() == nil {
		return nil, nil
	}
	return f.mel.PrepareDevice(x)
}

// FeaturesOn implements family.DeviceFrontend.
func (f frontend) FeaturesOn(q gpu.Queue, dst, x gpu.Tensor, in *audio.DeviceInput) {
	f.mel.ComputeOn(q, dst, x, in)
}
func (f frontend) Adapt(c *nn.Ctx, enc gpu.Tensor) gpu.Tensor { return f.enc.Adapt(c, enc) }

// EncodeBatch implements family.BatchFrontend: the conformer's EncodeBatch.
func (f frontend) EncodeBatch(c *nn.Ctx, feats gpu.Tensor, frames []int) (gpu.Tensor, []int) {
	rows := make([]int, len(frames))
	for i, n := range frames {
		rows[i] = f.enc.OutLen(n)
	}
	return f.enc.EncodeBatch(c, feats, frames), rows
}

var (
	_ family.BatchFrontend  = frontend{}
	_ family.DeviceFrontend = frontend{}
)

type backbone struct{ m *lfm2.Model }

func (b backbone) NewCache(dev gpu.Device) family.Cache { return b.m.NewCache(dev) }

// BytesFor is what a conversation's cache holds at positions positions
// (the engine's memory budget counts it).
func (b backbone) BytesFor(positions int) int64 { return b.m.BytesFor(positions) }
func (b backbone) EmbedTokens(c *nn.Ctx, dst gpu.Tensor, ids []int32) {
	b.m.EmbedTokens(c, dst, ids)
}
func (b backbone) Logits(c *nn.Ctx, dst, h gpu.Tensor) { b.m.Logits(c, dst, h) }

// Forward runs the LFM2 stack; every cache must come from NewCache.
func (b backbone) Forward(c *nn.Ctx, x gpu.Tensor, seqs []family.Seq) gpu.Tensor {
	ls := make([]lfm2.Seq, len(seqs))
	for i, s := range seqs {
		ls[i] = lfm2.Seq{Cache: s.Cache.(*lfm2.Cache), Rows: s.Rows}
	}
	return b.m.Forward(c, x, ls)
}

type head struct {
	d   *depth.Depth
	emb gpu.Tensor // audio_embedding.embedding [codebooks·d.Vocab, hidden]
}

func (h head) Frame(c *nn.Ctx, x gpu.Tensor, pick family.Picker) ([][]int, error) {
	return h.d.Frame(c, x, depth.Picker(pick))
}

func (h head) FrameSampled(c *nn.Ctx, x gpu.Tensor, rows [][]gpu.SampleRow) ([][]int, error) {
	return h.d.FrameSampled(c, x, rows)
}

// EmbedFrames writes the audio feedback of frames, a row each: the sum of
// a frame's codes' embeddings (codebook i offset by i·Vocab), rounded as
// the reference's bf16 sum — one Embed for all the frames.
func (h head) EmbedFrames(c *nn.Ctx, dst gpu.Tensor, frames [][]int) {
	if len(frames) != dst.Rows {
		panic(fmt.Sprintf("lfm2audio: %d frames embedded into %v", len(frames), dst))
	}
	if len(frames) == 0 {
		return
	}
	n := len(frames[0])
	ids := make([]int32, 0, n*len(frames))
	for _, codes := range frames {
		if len(codes) != n {
			panic(fmt.Sprintf("lfm2audio: frames of %d and %d codes", n, len(codes)))
		}
		for i, code := range codes {
			ids = append(ids, int32(code+i*h.d.Vocab))
		}
	}
	c.Q.Embed(dst, h.emb, ids)
	c.Round(dst)
}
