package tokenizer

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"unicode/utf8"
)

// conformance.json.gz holds tokenizers 0.23.2's output for many variants of
// the conformance tokenizers (other normalizers, pre-tokenizer chains,
// split behaviors, regex spellings, added-token flags, model options and
// decoders), made on the GPU box by testdata/gen_conformance.py.
type conformance struct {
	Version  string    `json:"tokenizers_version"`
	Texts    []string  `json:"texts"`
	Variants []variant `json:"variants"`
}

type variant struct {
	Name          string                     `json:"name"`
	Base          string                     `json:"base"`
	Patch         map[string]json.RawMessage `json:"patch"`
	LoadError     string                     `json:"load_error"`
	IDs           [][]int                    `json:"ids"`
	Decoded       []*string                  `json:"decoded"`
	RandomIDs     [][]int                    `json:"random_ids"`
	RandomDecoded []string                   `json:"random_decoded"`
	VocabSize     int                        `json:"vocab_size"`
	TokenToID     map[string]*int            `json:"token_to_id"`
}

// loadConformance reads testdata/name, a gzipped conformance record.
func loadConformance(t *testing.T, name string) conformance {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var c conformance
	if err := json.NewDecoder(zr).Decode(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// conformanceBases are the files gen_conformance.py patches.
var conformanceBases = map[string]string{
	"bytelevel":   "tokenizers/bytelevel/tokenizer.json",
	"llama3split": "tokenizers/llama3split/tokenizer.json",
	"lfm2tiny":    "lfm2-audio-tiny/tokenizer.json",
}

// build applies a variant's patch to its base tokenizer.json.
func (v variant) build(t *testing.T) []byte {
	t.Helper()
	base, ok := conformanceBases[v.Base]
	if !ok {
		t.Fatalf("unknown base %q", v.Base)
	}
	data, err := os.ReadFile(filepath.Join(fixtures, base))
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	var model map[string]json.RawMessage
	if err := json.Unmarshal(top["model"], &model); err != nil {
		t.Fatal(err)
	}
	for k, val := range v.Patch {
		switch k {
		case "model":
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(val, &fields); err != nil {
				t.Fatal(err)
			}
			for f, x := range fields {
				model[f] = x
			}
		case "vocab_add":
			var vocab, add map[string]int
			if err := json.Unmarshal(model["vocab"], &vocab); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(val, &add); err != nil {
				t.Fatal(err)
			}
			for tok, id := range add {
				vocab[tok] = id
			}
			model["vocab"] = mustMarshal(t, vocab)
		default:
			top[k] = val
		}
	}
	top["model"] = mustMarshal(t, model)
	return mustMarshal(t, top)
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConformance compares Encode, Decode, the stream decoder, VocabSize
// and TokenID with what tokenizers produced for every variant and text.
func TestConformance(t *testing.T) {
	c := loadConformance(t, "conformance.json.gz")
	t.Logf("tokenizers %s: %d variants x %d texts", c.Version, len(c.Variants), len(c.Texts))
	for _, v := range c.Variants {
		t.Run(v.Name, func(t *testing.T) {
			tok, err := Parse(v.build(t))
			if v.LoadError != "" {
				if err == nil {
					t.Fatalf("loaded a file tokenizers refuses (%s)", v.LoadError)
				}
				t.Logf("refused as tokenizers does: %v (tokenizers: %s)", err, v.LoadError)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			bad, panics := 0, 0
			report := func(format string, args ...any) {
				bad++
				if bad <= 8 {
					t.Errorf(format, args...)
				}
			}
			for i, text := range c.Texts {
				want := v.IDs[i]
				if got := tok.Encode(text); !sameIDs(got, want) {
					report("Encode(%q) = %v, want %v", text, got, want)
				}
				wantText := text
				if v.Decoded[i] != nil {
					wantText = *v.Decoded[i]
				}
				if wantText == hfPanic {
					panics++
					continue
				}
				if got := tok.Decode(want); got != wantText {
					report("Decode(%v) = %q, want %q", want, got, wantText)
				}
				if got := streamAll(tok, want); got != wantText {
					report("stream %v = %q, want %q", want, got, wantText)
				}
			}
			for i, ids := range v.RandomIDs {
				if v.RandomDecoded[i] == hfPanic {
					panics++
					continue
				}
				if got := tok.Decode(ids); got != v.RandomDecoded[i] {
					report("Decode(%v) = %q, want %q", ids, got, v.RandomDecoded[i])
				}
				if got := streamAll(tok, ids); got != v.RandomDecoded[i] {
					report("stream %v = %q, want %q", ids, got, v.RandomDecoded[i])
				}
			}
			if got := tok.VocabSize(); got != v.VocabSize {
				report("VocabSize = %d, want %d", got, v.VocabSize)
			}
			for s, want := range v.TokenToID {
				got, ok := tok.TokenID(s)
				if ok != (want != nil) || ok && got != *want {
					report("TokenID(%q) = %d, %v; want %v", s, got, ok, want)
				}
			}
			if panics > 0 {
				t.Logf("%d decodes skipped: tokenizers panicked on them", panics)
			}
			if bad > 0 {
				t.Errorf("%d mismatches", bad)
			}
		})
	}
}

// hfPanic marks a decode on which tokenizers panicked.
const hfPanic = "\x00panic"

func sameIDs(a, b []int) bool {
	return len(a) == 0 && len(b) == 0 || reflect.DeepEqual(a, b)
}

// streamAll feeds ids one at a time and checks every delta is valid UTF-8.
func streamAll(tok *Tokenizer, ids []int) string {
	d := tok.NewStreamDecoder()
	var s string
	for _, id := range ids {
		delta := d.Add(id)
		if !utf8.ValidString(delta) {
			return "invalid UTF-8 delta " + delta
		}
		s += delta
	}
	return s + d.Flush()
}
