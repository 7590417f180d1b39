package lfm2audio

import (
	"context"
	"fmt"

	"github.com/omni-pipe/omni-pipe/stages/detok"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/mimi"
)

// Model families: the same network up to the audio codes, different codecs.
const (
	FamilyLFM2Audio  = "lfm2-audio"
	FamilyLFM25Audio = "lfm2.5-audio"
)

// The codecs a model can decode its audio codes with.
const (
	// CodecMimi is Kyutai's Mimi, LFM2-Audio's codec.
	CodecMimi = "mimi"
	// CodecDetokenizer is LFM2.5-Audio's LFM2 detokenizer + iSTFT
	// (the audio_detokenizer folder).
	CodecDetokenizer = "detokenizer"
)

// Codecs lists the codec names, for flags.
var Codecs = []string{CodecMimi, CodecDetokenizer}

// Codec turns a model's audio codes (one frame of Codebooks() codes per
// 80 ms) into 24 kHz speech; Kind is CodecMimi or CodecDetokenizer.
type Codec = family.Codec

// CodecStream is one utterance's decoding state.
type CodecStream = family.CodecStream

type mimiCodec struct{ *mimi.Decoder }

func (mimiCodec) Kind() string { return CodecMimi }
func (mimiCodec) Lag() int     { return 0 }
func (c mimiCodec) NewStream() CodecStream {
	return mimiStream{c.Decoder.NewStream()}
}

type mimiStream struct{ *mimi.Stream }

func (mimiStream) Flush() []float32 { return nil }

type detokCodec struct{ *detok.Decoder }

func (detokCodec) Kind() string { return CodecDetokenizer }
func (c detokCodec) Decode(ctx context.Context, codes [][]int) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.Decoder.Decode(codes)
}
func (c detokCodec) NewStream() CodecStream { return detokStream{c.Decoder.NewStream()} }

type detokStream struct{ *detok.Stream }

func (s detokStream) DecodeFrames(ctx context.Context, codes [][]int) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.Stream.Decode(codes)
}

// DecodeBatch decodes several Mimi streams' next frames in the same passes
// (family.BatchCodec): each stream's samples are exactly its own
// DecodeFrames'.
func (c mimiCodec) DecodeBatch(ctx context.Context, streams []CodecStream, codes [][][]int) ([][]float32, error) {
	ms, err := unwrapStreams(streams, "a Mimi stream", func(s mimiStream) *mimi.Stream { return s.Stream })
	if err != nil {
		return nil, err
	}
	return c.Decoder.DecodeBatch(ctx, ms, codes)
}

var _ family.BatchCodec = mimiCodec{}

// DecodeBatch decodes several detokenizer streams' next frames in the same
// passes (family.BatchCodec): each stream's samples are exactly its own
// DecodeFrames'.
func (c detokCodec) DecodeBatch(ctx context.Context, streams []CodecStream, codes [][][]int) ([][]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ds, err := unwrapStreams(streams, "a detokenizer stream", func(s detokStream) *detok.Stream { return s.Stream })
	if err != nil {
		return nil, err
	}
	return c.Decoder.DecodeBatch(ctx, ds, codes)
}

// unwrapStreams returns the codec's own streams behind a batch's
// CodecStreams, each of which must be a W (what names it in the error).
func unwrapStreams[W CodecStream, S any](streams []CodecStream, what string, inner func(W) S) ([]S, error) {
	out := make([]S, len(streams))
	for i, s := range streams {
		w, ok := s.(W)
		if !ok {
			return nil, fmt.Errorf("lfm2audio: stream %d of the batch is a %T, not %s", i, s, what)
		}
		out[i] = inner(w)
	}
	return out, nil
}

var _ family.BatchCodec = detokCodec{}
