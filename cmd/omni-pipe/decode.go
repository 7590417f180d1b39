package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/omni-pipe/omni-pipe/stages/detok"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

func init() {
	register(&command{
		name: "decode",
		summary: `Decode audio codes to speech with the model's codec (Mimi, or LFM2.5-Audio's detokenizer): the
"codes" tensor ([codebooks, T] integers; a generate --dump's "mimi_codes" also works) of a safetensors
file. --chunk N decodes N frames at a time through the streaming path; --dump writes the detokenizer's
intermediate tensors (emb_mean, lfm_hidden, lin_out) and the waveform (wav) under the reference
fixtures' names.`,
		usage: "--model DIR --codes FILE.safetensors [--out reply.wav] [--dump FILE] [--chunk N] [flags]",
		setup: setupDecode,
	})
}

// maxChunk bounds --chunk: 2^20 frames are 23 hours of speech.
const maxChunk = 1 << 20

func setupDecode(fs *flag.FlagSet, e *env) func([]string) error {
	var mf modelFlags
	mf.register(fs, e)
	codesPath := fs.String("codes", "", "safetensors file holding the codes ([codebooks, T] integers, named codes or mimi_codes)")
	out := fs.String("out", "reply.wav", "where to write the speech (24 kHz 16-bit WAV); empty: don't")
	dump := fs.String("dump", "", "write the intermediate tensors and the waveform to this safetensors file")
	chunk := fs.Int("chunk", 0, "decode this many frames at a time through the streaming path (0: the whole utterance at once)")
	return func(args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if *codesPath == "" {
			return usageError{"--codes FILE is required"}
		}
		if err := intIn("--chunk", *chunk, 0, maxChunk); err != nil {
			return err
		}
		frames, err := readCodes(*codesPath)
		if err != nil {
			return err
		}
		m, dev, _, err := mf.open()
		if err != nil {
			return err
		}
		defer dev.Close()
		defer m.Close()
		if len(frames) > 0 && len(frames[0]) != m.AudioCodec().Codebooks() {
			return fmt.Errorf("%s: %d codebooks, the codec decodes %d", *codesPath, len(frames[0]), m.AudioCodec().Codebooks())
		}
		ctx := context.Background()
		var pcm []float32
		if *chunk == 0 {
			if pcm, err = m.AudioCodec().Decode(ctx, frames); err != nil {
				return err
			}
		} else {
			s := m.AudioCodec().NewStream()
			defer s.Close()
			for lo := 0; lo < len(frames); lo += *chunk {
				p, err := s.DecodeFrames(ctx, frames[lo:min(lo+*chunk, len(frames))])
				if err != nil {
					return err
				}
				pcm = append(pcm, p...)
			}
			pcm = append(pcm, s.Flush()...)
		}
		fmt.Fprintf(e.stderr, "%s: %d frames decoded with %s\n", m.Info().Name, len(frames), m.AudioCodec().Kind())
		if *dump != "" {
			if err := writeDecodeDump(*dump, m.AudioCodec(), frames, pcm); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "dump: %s\n", *dump)
		}
		if *out != "" {
			return writeWAV(*out, pcm, e.stderr)
		}
		return nil
	}
}

// readCodes reads the frames of a [codebooks, T] integer tensor named
// codes (or mimi_codes).
func readCodes(path string) ([][]int, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t := f.Tensor("codes")
	if t == nil {
		t = f.Tensor("mimi_codes")
	}
	if t == nil {
		return nil, fmt.Errorf("%s: no codes (or mimi_codes) tensor", path)
	}
	if len(t.Shape) != 2 || t.Shape[0] < 1 {
		return nil, fmt.Errorf("%s: codes have shape %v, want [codebooks, T]", path, t.Shape)
	}
	v, err := t.Int64s()
	if err != nil {
		return nil, fmt.Errorf("%s: codes: %w", path, err)
	}
	CB, T := t.Shape[0], t.Shape[1]
	frames := make([][]int, T)
	for j := range frames {
		frames[j] = make([]int, CB)
		for k := range CB {
			c := v[k*T+j]
			if c < -1<<31 || c >= 1<<31 {
				return nil, fmt.Errorf("%s: frame %d codebook %d: code %d out of range", path, j, k, c)
			}
			frames[j][k] = int(c)
		}
	}
	return frames, nil
}

// tracer is implemented by codecs that expose their intermediates (the
// detokenizer).
type tracer interface {
	DecodeTrace(codes [][]int) (*detok.Trace, error)
}

// writeDecodeDump writes wav and, for a codec that traces, its
// intermediate tensors of the whole decode.
func writeDecodeDump(path string, codec interface{ Kind() string }, frames [][]int, pcm []float32) error {
	tensors := []*safetensors.Tensor{safetensors.NewF32("wav", pcm, len(pcm))}
	if tr, ok := codec.(tracer); ok && len(frames) > 0 {
		t, err := tr.DecodeTrace(frames)
		if err != nil {
			return err
		}
		T := len(frames)
		H := len(t.EmbMean) / T
		R := detok.Upsample * T
		tensors = append(tensors,
			safetensors.NewF32("emb_mean", t.EmbMean, T, H),
			safetensors.NewF32("lfm_hidden", t.Hidden, R, H),
			safetensors.NewF32("lin_out", t.LinOut, R, len(t.LinOut)/R))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := safetensors.Write(f, tensors, map[string]string{"codec": codec.Kind()}); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
