package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"unicode/utf8"
)

const fixtures = "../../testdata"

type goldenCase struct {
	Text    string `json:"text"`
	IDs     []int  `json:"ids"`
	Decoded string `json:"decoded"`
}

func loadGolden(t *testing.T, path string) []goldenCase {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(g.Cases) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	return g.Cases
}

func mustLoad(t testing.TB, path string) *Tokenizer {
	t.Helper()
	tok, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestGolden checks every case tokenizers 0.23.2 recorded for the two
// conformance tokenizers: ids, decoded text, and the stream decoder fed
// one id at a time.
func TestGolden(t *testing.T) {
	for _, kind := range []string{"bytelevel", "llama3split"} {
		t.Run(kind, func(t *testing.T) {
			dir := filepath.Join(fixtures, "tokenizers", kind)
			tok := mustLoad(t, filepath.Join(dir, "tokenizer.json"))
			for i, c := range loadGolden(t, filepath.Join(dir, "golden.json")) {
				got := tok.Encode(c.Text)
				if !reflect.DeepEqual(got, c.IDs) && !(len(got) == 0 && len(c.IDs) == 0) {
					t.Errorf("case %d %q: Encode = %v, want %v", i, c.Text, got, c.IDs)
				}
				if d := tok.Decode(c.IDs); d != c.Decoded {
					t.Errorf("case %d %q: Decode = %q, want %q", i, c.Text, d, c.Decoded)
				}
				sd := tok.NewStreamDecoder()
				var streamed string
				for _, id := range c.IDs {
					delta := sd.Add(id)
					if !utf8.ValidString(delta) {
						t.Errorf("case %d %q: stream delta %q is not valid UTF-8", i, c.Text, delta)
					}
					streamed += delta
				}
				streamed += sd.Flush()
				if streamed != c.Decoded {
					t.Errorf("case %d %q: streamed %q, want %q", i, c.Text, streamed, c.Decoded)
				}
			}
		})
	}
}

// TestConcurrentEncode encodes the golden texts from several goroutines at
// once (run with -race): the word cache and the regexes are shared.
func TestConcurrentEncode(t *testing.T) {
	dir := filepath.Join(fixtures, "tokenizers", "llama3split")
	cases := loadGolden(t, filepath.Join(dir, "golden.json"))
	tok := mustLoad(t, filepath.Join(dir, "tokenizer.json"))
	errs := make(chan string, 4*len(cases))
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for _, c := range cases {
				if got := tok.Encode(c.Text); !sameIDs(got, c.IDs) {
					errs <- c.Text
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	close(errs)
	for text := range errs {
		t.Errorf("concurrent Encode(%q) differs", text)
	}
}
