// Package family is the engine's view of a model family: the few
// operations its stages run (the audio front end, the backbone's
// prefill/step, the audio head's frame, the codec's streaming decode) and
// what the turn logic reads (sizes, special tokens, the tokenizer, the
// conversation template with its default prompts and voices). A
// family's package implements Model and registers a constructor under the
// architecture its checkpoints' config.json names; Load reads config.json
// and dispatches to it, so that the pipeline never depends on a family's
// concrete types.
package family

import (
	"context"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

// Model is one loaded checkpoint of a family, as the engine's stages use
// it. Its parts are safe to use from the stage goroutines the engine runs
// (one per stage), each with its own nn.Ctx.
type Model interface {
	// Info returns the sizes and special tokens the engine allocates and
	// acts on. It does not change after load.
	Info() Info
	// Tokenizer is the text tokenizer; stages/chat frames the family's
	// prompts with it.
	Tokenizer() *tokenizer.Tokenizer
	// Template is how the family frames a conversation, its default
	// system prompts and its voices.
	Template() Template
	Frontend() Frontend
	// LM is the backbone.
	LM() Backbone
	// Head is the audio head that samples one frame of codes per audio
	// step, and embeds a frame to feed it back to the backbone.
	Head() AudioHead
	// AudioCodec decodes the audio codes to speech.
	AudioCodec() Codec
	// Close releases the checkpoint's mappings and device memory.
	Close() error
}

// Info is what the engine sizes its work by.
type Info struct {
	Name   string // the checkpoint's name (its folder's base name, or Options.Name)
	Family string // e.g. "lfm2-audio", "lfm2.5-audio"
	Params int64  // the parameters bound from the checkpoint

	HiddenSize int // the backbone's row width
	VocabSize  int // the backbone's text logits per row
	Codebooks  int // codes per audio frame

	// InterleavedText and InterleavedAudio are the text and audio steps
	// of one round of an interleaved turn.
	InterleavedText, InterleavedAudio int

	Special Special
}

// Special holds the token ids and the code the turn logic acts on: read at
// load from the checkpoint (tokenizer.json, the codec's configuration),
// never assumed.
type Special struct {
	IMEnd      int // <|im_end|>: the turn is over
	AudioStart int // <|audio_start|>: a sequential turn switches to audio
	TextEnd    int // <|text_end|>: an interleaved turn's text is done
	// EOA is the end-of-audio code: the codec's codebook size (its
	// quantizer's bins), the one code past the codec's codes in each of
	// the audio head's codebook vocabularies. A frame whose first code is
	// EOA ends the speech; a frame holding it anywhere is not decoded.
	EOA int
}

// Frontend turns an input clip into the rows the backbone reads: features
// on the host, then the encoder and its adapter on the device.
type Frontend interface {
	// SampleRate is the rate the features are computed at (the engine
	// resamples clips to it).
	SampleRate() int
	// Frames returns the feature frames of n samples at SampleRate, and
	// how many of them hold signal.
	Frames(n int) (frames, valid int)
	// Features computes the features of samples at SampleRate.
	Features(samples []float32) (*audio.Features, error)
	// Encode runs the encoder over the features [frames, bins].
	Encode(c *nn.Ctx, feats gpu.Tensor) gpu.Tensor
	// Adapt maps the encoder's output to backbone rows [n, HiddenSize].
	Adapt(c *nn.Ctx, enc gpu.Tensor) gpu.Tensor
}

// DeviceFrontend is implemented by front ends whose features a device can
// compute (on a gpu.LogMeler queue, the encoder's): the host keeps the
// checks and the pre-emphasis, the device the rest, with the floats of
// Features (package audio's LogMel.ComputeOn says how close).
type DeviceFrontend interface {
	// PrepareDevice checks samples (at SampleRate) and prepares them for
	// FeaturesOn; nil (and no error) where the device path does not
	// reproduce this front end's features.
	PrepareDevice(samples []float32) (*audio.DeviceInput, error)
	// FeaturesOn writes in's features into dst (F32 [in.Frames, in.Bins])
	// on q, with x (F32 [1, len(in.Samples)]) as scratch for the samples.
	FeaturesOn(q gpu.Queue, dst, x gpu.Tensor, in *audio.DeviceInput)
}

// BatchFrontend is implemented by front ends whose encoder runs several
// clips in one pass (the weights read once for every clip's rows).
type BatchFrontend interface {
	// EncodeBatch runs the encoder over the features of several clips:
	// feats [Σ frames, bins] holds clip i's frames[i] rows after clip
	// i−1's. It returns the clips' encoder outputs the same way, clip i's
	// rows[i] rows after clip i−1's, each clip's rows exactly, bit for bit,
	// what Encode returns for that clip alone. Adapt is row-wise: Adapt of
	// enc gives every clip's rows as Adapt of that clip's rows alone.
	EncodeBatch(c *nn.Ctx, feats gpu.Tensor, frames []int) (enc gpu.Tensor, rows []int)
}

// Cache is one conversation's backbone state.
type Cache interface {
	// Free releases its device memory.
	Free()
}

// Seq is one conversation's rows of a batched backbone pass.
type Seq struct {
	Cache Cache // from the same Backbone's NewCache
	Rows  int
}

// Backbone is the language model: prefill is a Forward of many rows, a
// step a Forward of one.
type Backbone interface {
	NewCache(dev gpu.Device) Cache
	// EmbedTokens writes the embeddings of the text tokens ids into dst
	// (one row each).
	EmbedTokens(c *nn.Ctx, dst gpu.Tensor, ids []int32)
	// Forward runs the rows x [Σ seqs' Rows, HiddenSize], seqs' rows in
	// order, each against its cache (which takes them), and returns the
	// output rows.
	Forward(c *nn.Ctx, x gpu.Tensor, seqs []Seq) gpu.Tensor
	// Logits writes the text logits [rows, VocabSize] of the rows h.
	Logits(c *nn.Ctx, dst, h gpu.Tensor)
}

// Picker chooses codebook i's code for batch row r from its logits. What
// it returns is fed to the next codebook.
type Picker func(r, codebook int, logits []float32) int

// AudioHead samples audio frames from backbone rows (LFM2-Audio's
// depthformer).
type AudioHead interface {
	// Frame computes one frame of Codebooks codes for every row of h
	// [B, HiddenSize], choosing each code with pick.
	Frame(c *nn.Ctx, h gpu.Tensor, pick Picker) ([][]int, error)
	// EmbedFrames writes the backbone input rows of sampled frames into
	// dst (a row per frame; one op for all of them where the device can).
	EmbedFrames(c *nn.Ctx, dst gpu.Tensor, frames [][]int)
}

// SampledHead is implemented by audio heads that also pick on the device:
// rows[i][r] samples codebook i of batch row r (gpu.Queue.Sample), and the
// frame returns to the host only its codes. The codes equal Frame's with a
// Picker that runs gpu.SampleHost on the same rows.
type SampledHead interface {
	FrameSampled(c *nn.Ctx, h gpu.Tensor, rows [][]gpu.SampleRow) ([][]int, error)
}

// Codec turns a model's audio codes (one frame of Codebooks() codes per
// step) into speech.
type Codec interface {
	// Kind names the codec, e.g. "mimi" or "detokenizer".
	Kind() string
	SampleRate() int
	// FrameSamples is the number of samples each frame decodes to.
	FrameSamples() int
	Codebooks() int
	// Lag is the number of samples a stream holds back until its Flush
	// (0 for Mimi, 480 for the detokenizer).
	Lag() int
	// Decode decodes a whole utterance: len(codes)·FrameSamples() samples.
	Decode(ctx context.Context, codes [][]int) ([]float32, error)
	// NewStream starts one utterance's streaming decode.
	NewStream() CodecStream
	Close() error
}

// CodecStream is one utterance's decoding state. The samples of its
// DecodeFrames calls and of its Flush, concatenated, are the utterance's
// whole decode.
type CodecStream interface {
	// DecodeFrames decodes the next frames and returns the samples they
	// complete. A code outside the codebooks (end-of-audio included) is an
	// error and leaves the stream untouched.
	DecodeFrames(ctx context.Context, codes [][]int) ([]float32, error)
	// Flush ends the utterance and returns the samples held back.
	Flush() []float32
	// Close releases the stream's memory.
	Close()
}

// BatchCodec is implemented by codecs that decode several utterances'
// next frames in one pass (the weights read once for every stream's rows),
// each stream keeping its own state.
type BatchCodec interface {
	// DecodeBatch decodes codes[i] on streams[i] (streams of this codec's
	// NewStream, each at most once) and returns each stream's samples:
	// exactly, bit for bit, what streams[i].DecodeFrames(ctx, codes[i])
	// would return. An error other than ctx's leaves every stream
	// untouched.
	DecodeBatch(ctx context.Context, streams []CodecStream, codes [][][]int) ([][]float32, error)
}
