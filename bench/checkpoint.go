package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing/fstest"

	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/mimi"
)

// File names of a synthetic checkpoint folder (those lfm2audio.Load reads).
const (
	ConfigFile      = "config.json"
	TokenizerFile   = "tokenizer.json"
	TokConfigFile   = "tokenizer_config.json"
	ModelFile       = "model.safetensors"
	CodecFile       = "mimi.safetensors"
	CodecConfigFile = "mimi_config.json"
)

// Checkpoint describes a synthetic LFM2-Audio checkpoint folder.
type Checkpoint struct {
	Config config.Audio
	Mimi   mimi.Config
	// Seed determines every value.
	Seed uint64
	// MaterializeTied stores the tied depth to_logits tables, as the
	// released model.safetensors does (2.94 GB with them).
	MaterializeTied bool
}

// Real returns LFM2-Audio-1.5B's sizes (its released config.json and
// mimi_config.json on Hugging Face, LiquidAI/LFM2-Audio-1.5B): LFM2 hidden
// 2048, 16 layers with attention at 2, 5, 8, 10, 12, 14, 32/8 heads, FFN
// 12288 auto-adjusted to 8192, vocabulary 65536; conformer 17 × 512 with 8
// heads and 256 subsampling channels; depthformer 6 × 1024; 8 codebooks;
// the official Mimi decoder (32 codebooks stored, 8 decoded).
func Real() Checkpoint {
	ff, adjust := 12288, true
	return Checkpoint{
		Config: config.Audio{
			Architectures:          []string{"Lfm2AudioForConditionalGeneration"},
			Codebooks:              8,
			SemanticCodebookFactor: 100,
			CodebookWeight:         "log",
			InterleavedNText:       6,
			InterleavedNAudio:      12,
			Preprocessor: config.Preprocessor{
				SampleRate: 16000, Normalize: "per_feature", WindowSize: 0.025, WindowStride: 0.01,
				Window: "hann", Features: 128, NFFT: 512, Log: true, FrameSplicing: 1, Dither: 1e-5,
			},
			Encoder: config.Encoder{
				FeatIn: 128, FeatOut: -1, NLayers: 17, DModel: 512,
				Subsampling: "dw_striding", SubsamplingFactor: 8, SubsamplingConvChannels: 256,
				FFExpansionFactor: 4, SelfAttentionModel: "rel_pos", NHeads: 8, AttContextSize: []int{-1, -1},
				UntieBiases: true, PosEmbMaxLen: 5000, ConvKernelSize: 9, ConvNormType: "batch_norm", Dropout: 0.1,
			},
			LFM: config.LFM2{
				VocabSize: 65536, HiddenSize: 2048, IntermediateSize: ff, BlockFFDim: &ff,
				NumHiddenLayers: 16, NumAttentionHeads: 32, NumKeyValueHeads: 8,
				MaxPositionEmbeddings: 128000, NormEps: 1e-5, RopeTheta: 1e6, ConvLCache: 3,
				BlockMultipleOf: 256, BlockFFNDimMultiplier: config.NullableFloat{Set: true, V: 1},
				BlockAutoAdjustFFDim: &adjust, FullAttnIdxs: []int{2, 5, 8, 10, 12, 14},
				BOSTokenID: 1, EOSTokenID: 7, PadTokenID: 0,
			},
			Depthformer: config.Depthformer{Layers: 6, Dim: 1024, Tie: true},
		},
		Mimi:            mimi.DefaultConfig(),
		Seed:            1,
		MaterializeTied: true,
	}
}

// Tiny returns a small checkpoint of the same structure for tests: LFM2
// hidden 32, 3 layers with attention at 1, 4/2 heads, FFN 96 → 64,
// vocabulary 512; conformer 2 × 32; depthformer 2 × 64; a narrow Mimi that
// stores 10 codebooks.
func Tiny() Checkpoint {
	c := Real()
	ff := 96
	c.Config.LFM.VocabSize, c.Config.LFM.HiddenSize = 512, 32
	c.Config.LFM.IntermediateSize, c.Config.LFM.BlockFFDim, c.Config.LFM.BlockMultipleOf = ff, &ff, 32
	c.Config.LFM.NumHiddenLayers, c.Config.LFM.FullAttnIdxs = 3, []int{1}
	c.Config.LFM.NumAttentionHeads, c.Config.LFM.NumKeyValueHeads = 4, 2
	e := &c.Config.Encoder
	e.NLayers, e.DModel, e.NHeads, e.SubsamplingConvChannels = 2, 32, 4, 16
	c.Config.Depthformer = config.Depthformer{Layers: 2, Dim: 64, Tie: true}
	m := &c.Mimi
	m.SEANet.NFilters, m.SEANet.Dimension = 2, 16
	m.Quantizer = mimi.QuantizerConfig{Dimension: 8, NQ: 10, Bins: 2048, InputDimension: 16, OutputDimension: 16, NQSemantic: 1}
	m.Transformer.DModel, m.Transformer.NumHeads, m.Transformer.NumLayers = 16, 2, 2
	m.Transformer.DimFeedforward, m.Transformer.InputDimension = 24, 16
	m.Transformer.OutputDimensions = []int{16}
	c.MaterializeTied = false
	return c
}

// ModelTensors returns the tensors of model.safetensors, its audio tables
// sized by the codec's codebook size.
func (c *Checkpoint) ModelTensors() ([]TensorSpec, error) {
	cfg := c.Config
	return ModelTensors(&cfg, c.Mimi.Quantizer.Bins, c.MaterializeTied)
}

// MimiTensors returns the tensors of mimi.safetensors.
func (c *Checkpoint) MimiTensors() ([]TensorSpec, error) { return MimiTensors(c.Mimi) }

// Bytes returns the size of the two weight files' data.
func (c *Checkpoint) Bytes() (int64, error) {
	m, err := c.ModelTensors()
	if err != nil {
		return 0, err
	}
	k, err := c.MimiTensors()
	if err != nil {
		return 0, err
	}
	return TotalBytes(m) + TotalBytes(k), nil
}

// ConfigJSON returns config.json: the Config's fields under their
// config.json keys, plus the keys of the released file that the loader
// does not read (encoder reductions and dropouts, lfm model_type).
func (c *Checkpoint) ConfigJSON() ([]byte, error) {
	top, err := toMap(c.Config)
	if err != nil {
		return nil, err
	}
	lfm, err := toMap(c.Config.LFM)
	if err != nil {
		return nil, err
	}
	switch m := c.Config.LFM.BlockFFNDimMultiplier; {
	case !m.Set:
		delete(lfm, "block_ffn_dim_multiplier")
	case m.Null:
		lfm["block_ffn_dim_multiplier"] = nil
	default:
		lfm["block_ffn_dim_multiplier"] = m.V
	}
	lfm["model_type"] = "lfm2"
	lfm["architectures"] = []string{"Lfm2ForCausalLM"}
	top["lfm"] = lfm
	enc := top["encoder"].(map[string]any)
	for k, v := range map[string]any{"reduction": nil, "reduction_position": nil, "reduction_factor": 1,
		"dropout_pre_encoder": 0.1, "dropout_emb": 0.0, "dropout_att": 0.1} {
		if _, ok := enc[k]; !ok {
			enc[k] = v
		}
	}
	return json.MarshalIndent(top, "", "  ")
}

// toMap converts v to its JSON object, dropping null members.
func toMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	for k, x := range m {
		if x == nil {
			delete(m, k)
		}
	}
	return m, nil
}

// small returns the folder's files other than the weights.
func (c *Checkpoint) small() (map[string][]byte, error) {
	cfg, err := c.ConfigJSON()
	if err != nil {
		return nil, err
	}
	tok, err := TokenizerJSON(c.Config.LFM.VocabSize)
	if err != nil {
		return nil, err
	}
	tokCfg, err := json.MarshalIndent(map[string]any{
		"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>",
		"eos_token": "<|im_end|>", "pad_token": "<|pad|>", "model_max_length": 32768,
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	mimiCfg, err := json.MarshalIndent(c.Mimi, "", "  ")
	if err != nil {
		return nil, err
	}
	return map[string][]byte{ConfigFile: cfg, TokenizerFile: tok, TokConfigFile: tokCfg, CodecConfigFile: mimiCfg}, nil
}

func (c *Checkpoint) metadata() map[string]string {
	return map[string]string{"format": "pt", "generator": "omni-pipe bench (synthetic random weights)", "seed": strconv.FormatUint(c.Seed, 10)}
}

// WriteDir writes the checkpoint folder into dir (created if needed).
func (c *Checkpoint) WriteDir(dir string) error {
	model, err := c.ModelTensors()
	if err != nil {
		return err
	}
	codec, err := c.MimiTensors()
	if err != nil {
		return err
	}
	files, err := c.small()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	if err := WriteSafetensors(filepath.Join(dir, ModelFile), model, c.Seed, c.metadata()); err != nil {
		return err
	}
	return WriteSafetensors(filepath.Join(dir, CodecFile), codec, c.Seed+1, c.metadata())
}

// FS returns the checkpoint folder in memory (for small checkpoints:
// loading from an fs.FS copies every file).
func (c *Checkpoint) FS() (fstest.MapFS, error) {
	model, err := c.ModelTensors()
	if err != nil {
		return nil, err
	}
	codec, err := c.MimiTensors()
	if err != nil {
		return nil, err
	}
	files, err := c.small()
	if err != nil {
		return nil, err
	}
	fsys := fstest.MapFS{}
	for name, data := range files {
		fsys[name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	if fsys[ModelFile], err = memFile(model, c.Seed, c.metadata()); err != nil {
		return nil, err
	}
	if fsys[CodecFile], err = memFile(codec, c.Seed+1, c.metadata()); err != nil {
		return nil, err
	}
	return fsys, nil
}

func memFile(specs []TensorSpec, seed uint64, md map[string]string) (*fstest.MapFile, error) {
	data, err := Safetensors(specs, seed, md)
	if err != nil {
		return nil, err
	}
	return &fstest.MapFile{Data: data, Mode: 0o444}, nil
}
