package tokenizer

import (
	"path/filepath"
	"strings"
	"testing"
)

const benchText = "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 1,234,567 reasons.\n" +
	"Liquid models speak and listen; they stream text and 24 kHz audio in real time. Ça va? Très bien, merci.\n"

func benchTokenizers(b *testing.B) map[string]*Tokenizer {
	return map[string]*Tokenizer{
		"bytelevel":   mustLoad(b, filepath.Join(fixtures, "tokenizers", "bytelevel", "tokenizer.json")),
		"llama3split": mustLoad(b, filepath.Join(fixtures, "tokenizers", "llama3split", "tokenizer.json")),
	}
}

// BenchmarkEncode encodes about 1 KiB of mixed text; the BPE word cache
// is warm after the first iteration, as in a server.
func BenchmarkEncode(b *testing.B) {
	text := strings.Repeat(benchText, 5)
	for name, tok := range benchTokenizers(b) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for i := 0; i < b.N; i++ {
				tok.Encode(text)
			}
		})
	}
}

// BenchmarkEncodePrompt encodes the speech-to-speech prompt segments.
func BenchmarkEncodePrompt(b *testing.B) {
	tok := mustLoad(b, filepath.Join(fixtures, "lfm2-audio-tiny", "tokenizer.json"))
	segs := []string{"<|startoftext|>", "<|im_start|>system\n", "Respond with interleaved text and audio.",
		"<|im_end|>\n", "<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n"}
	for i := 0; i < b.N; i++ {
		for _, s := range segs {
			tok.Encode(s)
		}
	}
}

// BenchmarkStream decodes the ids of the benchmark text one at a time.
func BenchmarkStream(b *testing.B) {
	tok := mustLoad(b, filepath.Join(fixtures, "tokenizers", "bytelevel", "tokenizer.json"))
	ids := tok.Encode(strings.Repeat(benchText, 5))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d := tok.NewStreamDecoder()
		for _, id := range ids {
			d.Add(id)
		}
		d.Flush()
	}
}

// BenchmarkLoad parses a tokenizer.json (65 KB here; LFM2's is a few MB).
func BenchmarkLoad(b *testing.B) {
	path := filepath.Join(fixtures, "tokenizers", "llama3split", "tokenizer.json")
	for i := 0; i < b.N; i++ {
		mustLoad(b, path)
	}
}
