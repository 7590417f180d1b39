// Package lfm2audio loads an LFM2-Audio checkpoint folder as released on
// Hugging Face (config.json, model.safetensors, tokenizer.json and the Mimi
// codec's weights) into the networks the engine runs, and reports what it
// bound.
package lfm2audio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/conformer"
	"github.com/omni-pipe/omni-pipe/stages/depth"
	"github.com/omni-pipe/omni-pipe/stages/detok"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/lfm2"
	"github.com/omni-pipe/omni-pipe/stages/mimi"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// Codec weight file names, in the order they are looked for.
var codecFiles = []string{
	"tokenizer-e351c8d8-checkpoint125.safetensors", // the official LFM2-Audio release (moshi naming)
	"mimi.safetensors",
}

// melWorkers bounds the goroutines of one clip's log-mel.
const melWorkers = 8

// Model is a loaded LFM2-Audio model.
type Model struct {
	Name string // the folder's base name, or "demo"
	// Family is FamilyLFM2Audio, or FamilyLFM25Audio for a folder with an
	// audio_detokenizer (whichever codec was chosen).
	Family   string
	Cfg      *config.Audio
	Tok      *tokenizer.Tokenizer
	Mel      *audio.LogMel
	Encoder  *conformer.Encoder
	Backbone *lfm2.Model
	AudioEmb gpu.Tensor // audio_embedding.embedding [codebooks·Depth.Vocab, hidden]
	Depth    *depth.Depth
	// Codec decodes the audio codes: Mimi (LFM2-Audio) or the
	// detokenizer (LFM2.5-Audio), chosen at load (see Options).
	Codec Codec
	// Special is what the turn logic acts on, read from the checkpoint.
	Special Special

	// Params counts the parameters bound from model.safetensors; Bound
	// lists their names.
	Params int64
	Bound  []string

	files []*safetensors.File
}

// The special tokens the engine needs, by their text in tokenizer.json.
// The conversation is framed with the first two (chat writes them as text);
// the turn logic acts on the last three.
const (
	TokStartOfText = "<|startoftext|>"
	TokIMStart     = "<|im_start|>"
	TokIMEnd       = "<|im_end|>"
	TokAudioStart  = "<|audio_start|>"
	TokTextEnd     = "<|text_end|>"
)

// Special holds the token ids and the code the turn logic acts on: read at
// load from tokenizer.json (by token text) and from the codec's
// configuration, never assumed.
type Special = family.Special

// special looks up the special tokens in tok, for a backbone of vocab ids.
func special(tok *tokenizer.Tokenizer, vocab int) (Special, error) {
	ids := map[string]int{}
	seen := map[int]string{}
	for _, s := range []string{TokStartOfText, TokIMStart, TokIMEnd, TokAudioStart, TokTextEnd} {
		id, ok := tok.TokenID(s)
		switch {
		case !ok:
			return Special{}, fmt.Errorf("no %s token (the engine needs %s, %s, %s, %s and %s)", s, TokStartOfText, TokIMStart, TokIMEnd, TokAudioStart, TokTextEnd)
		case id < 0 || id >= vocab:
			return Special{}, fmt.Errorf("%s is id %d, outside the backbone's vocabulary of %d", s, id, vocab)
		case seen[id] != "":
			return Special{}, fmt.Errorf("%s and %s are the same id %d", seen[id], s, id)
		}
		ids[s], seen[id] = id, s
	}
	return Special{IMEnd: ids[TokIMEnd], AudioStart: ids[TokAudioStart], TextEnd: ids[TokTextEnd]}, nil
}

// Summary describes the loaded model in a few lines (for logs).
func (m *Model) Summary() string {
	c := m.Cfg
	attn := c.LFM.AttentionLayers()
	return fmt.Sprintf("%s (%s): %.3gM parameters bound in %d tensors\n"+
		"  backbone: LFM2 %d layers (%d attention) × %d, FFN %d, vocab %d\n"+
		"  encoder: FastConformer %d × %d, %d heads; adapter → %d\n"+
		"  depthformer: %d × %d, %d codebooks × %d; codec: %s, %d samples per frame at %d Hz",
		m.Name, m.Family, float64(m.Params)/1e6, len(m.Bound),
		c.LFM.NumHiddenLayers, attn, c.LFM.HiddenSize, c.LFM.FFNDim(), c.LFM.VocabSize,
		c.Encoder.NLayers, c.Encoder.DModel, c.Encoder.NHeads, c.LFM.HiddenSize,
		c.Depthformer.Layers, c.Depthformer.Dim, c.Codebooks, m.Depth.Vocab, m.Codec.Kind(), m.Codec.FrameSamples(), m.Codec.SampleRate())
}

// Close releases the checkpoint mappings and device memory.
func (m *Model) Close() error {
	var errs []error
	if m.Codec != nil {
		errs = append(errs, m.Codec.Close())
	}
	for _, f := range m.files {
		errs = append(errs, f.Close())
	}
	m.files = nil
	return errors.Join(errs...)
}

// Options choose among what a checkpoint folder holds.
type Options struct {
	// Codec is CodecMimi, CodecDetokenizer, or "" for the folder's
	// default: the detokenizer when it holds an audio_detokenizer folder
	// (LFM2.5-Audio), else Mimi (LFM2-Audio).
	Codec string
}

// Load loads the checkpoint folder dir onto dev with the default options.
// The safetensors files are memory-mapped.
func Load(dev gpu.Device, dir string) (*Model, error) { return LoadWith(dev, dir, Options{}) }

// LoadWith loads the checkpoint folder dir onto dev.
func LoadWith(dev gpu.Device, dir string, opts Options) (*Model, error) {
	m, err := load(dev, dirSource{dir}, opts)
	if err != nil {
		return nil, fmt.Errorf("load model %s: %w", dir, err)
	}
	m.Name = filepath.Base(filepath.Clean(dir))
	return m, nil
}

// LoadFS loads a checkpoint folder from fsys (read into memory; for the
// embedded demo model).
func LoadFS(dev gpu.Device, fsys fs.FS, name string) (*Model, error) {
	return LoadFSWith(dev, fsys, name, Options{})
}

// LoadFSWith is LoadFS with options.
func LoadFSWith(dev gpu.Device, fsys fs.FS, name string, opts Options) (*Model, error) {
	m, err := load(dev, fsSource{fsys}, opts)
	if err != nil {
		return nil, fmt.Errorf("load model %s: %w", name, err)
	}
	m.Name = name
	return m, nil
}

type source interface {
	read(name string) ([]byte, error)
	open(name string) (*safetensors.File, error)
	exists(name string) bool
}

type dirSource struct{ dir string }

func (d dirSource) read(name string) ([]byte, error) { return os.ReadFile(filepath.Join(d.dir, name)) }
func (d dirSource) open(name string) (*safetensors.File, error) {
	return safetensors.Open(filepath.Join(d.dir, name))
}
func (d dirSource) exists(name string) bool {
	_, err := os.Stat(filepath.Join(d.dir, name))
	return err == nil
}

type fsSource struct{ fsys fs.FS }

func (s fsSource) read(name string) ([]byte, error) { return fs.ReadFile(s.fsys, name) }
func (s fsSource) open(name string) (*safetensors.File, error) {
	data, err := fs.ReadFile(s.fsys, name)
	if err != nil {
		return nil, err
	}
	return safetensors.Parse(data, name)
}
func (s fsSource) exists(name string) bool {
	_, err := fs.Stat(s.fsys, name)
	return err == nil
}

func load(dev gpu.Device, src source, opts Options) (_ *Model, err error) {
	m := &Model{}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	cfgData, err := src.read("config.json")
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if m.Cfg, err = config.ParseAudio(cfgData); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	tokData, err := src.read("tokenizer.json")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if m.Tok, err = tokenizer.Parse(tokData); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if m.Tok.VocabSize() > m.Cfg.LFM.VocabSize {
		return nil, fmt.Errorf("tokenizer.json has %d tokens, the backbone's vocabulary %d", m.Tok.VocabSize(), m.Cfg.LFM.VocabSize)
	}
	if m.Special, err = special(m.Tok, m.Cfg.LFM.VocabSize); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	// The STFT frames of a clip are shared by up to melWorkers goroutines
	// (the same features: frames are independent). It runs on the host
	// whatever the device; serially it took 8.6 ms of a 75 ms first audio
	// on an H200 box for a 4.9 s question.
	if m.Mel, err = audio.NewLogMel(m.Cfg.Preprocessor, audio.LogMelOptions{Workers: min(runtime.GOMAXPROCS(0), melWorkers)}); err != nil {
		return nil, fmt.Errorf("preprocessor: %w", err)
	}

	// The codec first (Mimi's configuration, or the whole detokenizer):
	// its codebook size sizes the depthformer's tables and is
	// end-of-audio.
	kind, err := chooseCodec(src, opts.Codec)
	if err != nil {
		return nil, err
	}
	m.Family = FamilyLFM2Audio
	if src.exists(detok.DirName + "/" + detok.ConfigName) {
		m.Family = FamilyLFM25Audio
	}
	var codecName string
	var codecCfg mimi.Config
	if kind == CodecMimi {
		if codecName, codecCfg, err = m.codecConfig(src); err != nil {
			return nil, err
		}
		m.Special.EOA = codecCfg.Quantizer.Bins
	} else {
		codecName = detok.DirName
		if err := m.loadDetokenizer(dev, src); err != nil {
			return nil, err
		}
		m.Special.EOA = m.Codec.(detokCodec).Bins()
	}

	f, err := src.open("model.safetensors")
	if err != nil {
		return nil, err
	}
	m.files = append(m.files, f)
	cfg := m.Cfg
	if err := checkCodebookSize(f, codecName, m.Special.EOA); err != nil {
		return nil, err
	}
	b := weights.New(dev, f)
	H := cfg.LFM.HiddenSize
	m.Backbone, err = lfm2.Load(b.Sub("lfm"), cfg.LFM)
	if err != nil {
		return nil, err
	}
	m.Encoder, err = conformer.Load(b, cfg.Encoder, H)
	if err != nil {
		return nil, err
	}
	m.Depth, err = depth.Load(b, cfg.Depthformer, cfg.Codebooks, m.Special.EOA, H)
	if err != nil {
		return nil, err
	}
	m.AudioEmb = b.Tensor("audio_embedding.embedding.weight", cfg.Codebooks*m.Depth.Vocab, H)
	// The audio embedding's own norm and output head are training-only
	// (tie_audio_embeddings false: unused at inference).
	b.Skip("audio_embedding.embedding_norm.weight", "audio_embedding.to_logits.weight", "codebook_offsets", "audio_loss_weights")
	if err := b.Err(); err != nil {
		return nil, err
	}
	if extra := b.Unexpected(); len(extra) > 0 {
		return nil, fmt.Errorf("model.safetensors holds %d tensors this model does not use, e.g. %q: is it an LFM2-Audio checkpoint?", len(extra), extra[0])
	}
	m.Params, m.Bound = b.Params(), b.Bound()

	if kind == CodecMimi {
		if err := m.loadCodec(dev, src, codecName, codecCfg); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// chooseCodec returns the codec to load: want if the folder holds it, or
// the folder's default for "".
func chooseCodec(src source, want string) (string, error) {
	hasDetok := src.exists(detok.DirName + "/" + detok.ConfigName)
	hasMimi := false
	for _, n := range codecFiles {
		hasMimi = hasMimi || src.exists(n)
	}
	switch want {
	case "":
		if hasDetok {
			return CodecDetokenizer, nil
		}
		return CodecMimi, nil
	case CodecMimi:
		if !hasMimi {
			return "", fmt.Errorf("codec mimi: no Mimi weights (looked for %v)", codecFiles)
		}
		return CodecMimi, nil
	case CodecDetokenizer:
		if !hasDetok {
			return "", fmt.Errorf("codec detokenizer: no %s/%s (an LFM2.5-Audio folder has one)", detok.DirName, detok.ConfigName)
		}
		return CodecDetokenizer, nil
	}
	return "", fmt.Errorf("unknown codec %q (want %s or %s)", want, CodecMimi, CodecDetokenizer)
}

// loadDetokenizer loads the audio_detokenizer folder as the codec.
func (m *Model) loadDetokenizer(dev gpu.Device, src source) error {
	data, err := src.read(detok.DirName + "/" + detok.ConfigName)
	if err != nil {
		return err
	}
	cfg, err := detok.ParseConfig(data)
	if err != nil {
		return fmt.Errorf("%s/%s: %w", detok.DirName, detok.ConfigName, err)
	}
	if m.Cfg.Codebooks != detok.Codebooks {
		return fmt.Errorf("config.json has %d codebooks; the detokenizer decodes %d", m.Cfg.Codebooks, detok.Codebooks)
	}
	f, err := src.open(detok.DirName + "/" + detok.WeightsName)
	if err != nil {
		return err
	}
	m.files = append(m.files, f)
	d, err := detok.New(dev, f, *cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", detok.DirName, err)
	}
	m.Codec = detokCodec{d}
	return nil
}

// codecConfig finds the codec's weight file and reads its configuration
// (mimi_config.json, or the official Mimi's when absent), set to decode
// the model's codebooks and validated.
func (m *Model) codecConfig(src source) (name string, cfg mimi.Config, err error) {
	for _, n := range codecFiles {
		if src.exists(n) {
			name = n
			break
		}
	}
	if name == "" {
		return "", cfg, fmt.Errorf("no codec weights: looked for %v", codecFiles)
	}
	cfg = mimi.DefaultConfig()
	if src.exists("mimi_config.json") {
		data, err := src.read("mimi_config.json")
		if err != nil {
			return "", cfg, err
		}
		if cfg, err = mimi.ParseConfig(data); err != nil {
			return "", cfg, fmt.Errorf("mimi_config.json: %w", err)
		}
	}
	// The codec decodes as many codebooks as the model emits per frame
	// (moshi's set_num_codebooks).
	cfg.NumCodebooksActive = m.Cfg.Codebooks
	if err := cfg.Validate(); err != nil {
		return "", cfg, fmt.Errorf("codec %s, decoding config.json's %d codebooks: %w", name, m.Cfg.Codebooks, err)
	}
	return name, cfg, nil
}

// checkCodebookSize checks that the depthformer's first codebook table in
// f holds the codec's codebookSize codes and end-of-audio, so that a codec
// that does not belong to the model fails with a sentence rather than a
// list of mismatched shapes.
func checkCodebookSize(f *safetensors.File, codecName string, codebookSize int) error {
	const table = "depth_embeddings.0.embedding.weight"
	t := f.Tensor(table)
	if t == nil || len(t.Shape) != 2 {
		return nil // the binder reports it
	}
	if want := depth.VocabSize(codebookSize); t.Shape[0] != want {
		return fmt.Errorf("the depthformer's codebook tables hold %d entries (%s), the codec %s has %d codes per codebook: want %d (the codes and end-of-audio)",
			t.Shape[0], table, codecName, codebookSize, want)
	}
	return nil
}

// loadCodec loads the codec's weights from the file name with its
// configuration cfg (from codecConfig).
func (m *Model) loadCodec(dev gpu.Device, src source, name string, cfg mimi.Config) error {
	f, err := src.open(name)
	if err != nil {
		return err
	}
	m.files = append(m.files, f)
	d, err := mimi.New(dev, f, cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	m.Codec = mimiCodec{d}
	if d.SampleRate() != 24000 {
		return fmt.Errorf("%s: codec sample rate %d, want 24000", name, d.SampleRate())
	}
	return nil
}
