package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// patched returns the bytelevel conformance tokenizer.json with top-level
// keys replaced by the given JSON texts ("" deletes the key).
func patched(t *testing.T, patch map[string]string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fixtures, "tokenizers", "bytelevel", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	for k, v := range patch {
		if v == "" {
			delete(top, k)
		} else {
			top[k] = json.RawMessage(v)
		}
	}
	out, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLoadErrors checks that what this package does not implement, or a
// broken file, is refused at load with an error naming the component.
func TestLoadErrors(t *testing.T) {
	const tinyModel = `{"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}`
	for _, c := range []struct {
		name  string
		patch map[string]string
		want  string // substring of the error
	}{
		{"unigram model", map[string]string{"model": `{"type": "Unigram", "vocab": []}`}, `model: unsupported type "Unigram"`},
		{"wordpiece model", map[string]string{"model": `{"type": "WordPiece", "vocab": {}}`}, `model: unsupported type "WordPiece"`},
		{"wordlevel model", map[string]string{"model": `{"type": "WordLevel", "vocab": {}}`}, `model: unsupported type "WordLevel"`},
		{"model without type", map[string]string{"model": `{"vocab": {}, "merges": []}`}, `model: missing "type"`},
		{"no model", map[string]string{"model": ""}, "model: missing"},
		{"dropout", map[string]string{"model": `{"type": "BPE", "dropout": 0.1, "vocab": {}, "merges": []}`}, "dropout 0.1 is not supported"},
		{"merge out of vocab", map[string]string{"model": `{"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}`}, `"b" is not in the vocabulary`},
		{"merge result out of vocab", map[string]string{"model": `{"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}`}, `result "ab" is not in the vocabulary`},
		{"bad merge line", map[string]string{"model": `{"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]}`}, "not two tokens"},
		{"mixed merges", map[string]string{"model": `{"type": "BPE", "vocab": {"a": 0}, "merges": ["a b", ["a", "b"]]}`}, "want a list"},
		{"negative id", map[string]string{"model": `{"type": "BPE", "vocab": {"a": -1}, "merges": []}`}, "is not an integer"},
		{"fractional id", map[string]string{"model": `{"type": "BPE", "vocab": {"a": 1.5}, "merges": []}`}, "is not an integer"},
		{"unk not in vocab", map[string]string{"model": `{"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0}, "merges": []}`}, `unk_token "<unk>"`},
		{"metaspace pre-tokenizer", map[string]string{"pre_tokenizer": `{"type": "Metaspace", "replacement": "▁"}`}, `pre_tokenizer: unsupported type "Metaspace"`},
		{"nested unsupported", map[string]string{"pre_tokenizer": `{"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}, {"type": "UnicodeScripts"}]}`}, `pre_tokenizer: Sequence[1]: unsupported type "UnicodeScripts"`},
		{"bad behavior", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Dropped", "invert": false}`}, `unknown split behavior "Dropped"`},
		{"bad regex", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated", "invert": false}`}, `regex "(a"`},
		{"posix class", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"Regex": "[[:alpha:]]+"}, "behavior": "Isolated", "invert": false}`}, "POSIX bracket"},
		{"class intersection", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"Regex": "[a-z&&[^x]]"}, "behavior": "Isolated", "invert": false}`}, "set operation"},
		{"keep escape", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"Regex": "a\\Kb"}, "behavior": "Isolated", "invert": false}`}, `regex "a\\Kb"`},
		{"pattern without kind", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {}, "behavior": "Isolated", "invert": false}`}, `pattern needs "String" or "Regex"`},
		{"precompiled normalizer", map[string]string{"normalizer": `{"type": "Precompiled", "precompiled_charsmap": ""}`}, `normalizer: unsupported type "Precompiled"`},
		{"bert normalizer", map[string]string{"normalizer": `{"type": "BertNormalizer"}`}, `normalizer: unsupported type "BertNormalizer"`},
		{"nested normalizer", map[string]string{"normalizer": `{"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Precompiled"}]}`}, `normalizer: Sequence[1]: unsupported type "Precompiled"`},
		{"wordpiece decoder", map[string]string{"decoder": `{"type": "WordPiece", "prefix": "##"}`}, `decoder: unsupported type "WordPiece"`},
		{"metaspace decoder", map[string]string{"decoder": `{"type": "Metaspace"}`}, `decoder: unsupported type "Metaspace"`},
		{"ctc decoder", map[string]string{"decoder": `{"type": "Sequence", "decoders": [{"type": "CTC"}]}`}, `decoder: Sequence[0]: unsupported type "CTC"`},
		{"strip decoder content", map[string]string{"decoder": `{"type": "Strip", "content": "ab", "start": 1, "stop": 0}`}, "Strip: want"},
		{"version", map[string]string{"version": `"2.0"`}, `unknown version "2.0"`},
		{"added token without content", map[string]string{"model": tinyModel, "added_tokens": `[{"id": 5, "special": true}]`}, "added_tokens[0]: missing content"},
		{"not json", nil, "unexpected end of JSON input"},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := []byte(`{"model": `)
			if c.patch != nil {
				data = patched(t, c.patch)
			}
			tok, err := Parse(data)
			if err == nil {
				t.Fatalf("Parse succeeded (%T), want an error containing %q", tok, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
			t.Logf("%v", err)
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "tokenizer.json"))
	if err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("Load of a missing file: %v", err)
	}
}

// TestMergeForms checks that merges as "a b" strings and as ["a", "b"]
// pairs give the same tokenizer, and that a duplicated pair keeps its last
// rank as tokenizers does.
func TestMergeForms(t *testing.T) {
	const vocab = `{"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}`
	for _, c := range []struct {
		merges string
		want   []int
	}{
		{`["a b", "ab c"]`, []int{5}},
		{`[["a", "b"], ["ab", "c"]]`, []int{5}},
		{`["#version: 0.2", "b c", "a b"]`, []int{0, 4}},
		{`[["b", "c"], ["a", "b"]]`, []int{0, 4}},
		// "b c" listed again after "a b": its last rank (2) loses to "a b".
		{`["b c", "a b", "b c", "ab c"]`, []int{5}},
	} {
		data := patched(t, map[string]string{
			"model":         `{"type": "BPE", "vocab": ` + vocab + `, "merges": ` + c.merges + `}`,
			"added_tokens":  `[]`,
			"pre_tokenizer": "",
			"decoder":       "",
		})
		tok, err := Parse(data)
		if err != nil {
			t.Fatalf("merges %s: %v", c.merges, err)
		}
		if got := tok.Encode("abc"); !sameIDs(got, c.want) {
			t.Errorf("merges %s: Encode(abc) = %v, want %v", c.merges, got, c.want)
		}
	}
}
