package tokenizer

import (
	"math/rand"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestLossy pins the U+FFFD substitution to Rust's from_utf8_lossy (and
// Python's errors="replace"): one U+FFFD per maximal ill-formed subpart.
func TestLossy(t *testing.T) {
	for _, c := range []struct {
		in, want string
	}{
		{"", ""},
		{"abc", "abc"},
		{"\xE2\x82\xAC", "€"},
		{"\xE2\x82", "\uFFFD"},         // truncated 3-byte sequence: one
		{"\xE2\x82A", "\uFFFDA"},       // ... also when something follows
		{"\xE2A\x82", "\uFFFDA\uFFFD"}, // a lone continuation byte: one each
		{"\xF0\x9F\x98", "\uFFFD"},     // truncated emoji
		{"\xF0\x9F\x98\xF0\x9F\x98\x80", "\uFFFD😀"},
		{"\xC0\xAF", "\uFFFD\uFFFD"},                     // overlong lead bytes are invalid alone
		{"\xED\xA0\x80", "\uFFFD\uFFFD\uFFFD"},           // a surrogate
		{"\xF4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"}, // above U+10FFFF
		{"\xE0\x80\x80", "\uFFFD\uFFFD\uFFFD"},
		{"\xFF\xFE", "\uFFFD\uFFFD"},
		{"a\x80\x80b", "a\uFFFD\uFFFDb"},
	} {
		if got := string(appendLossy(nil, []byte(c.in))); got != c.want {
			t.Errorf("lossy(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestSettled checks where the stream decoder may cut a byte buffer.
func TestSettled(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"ab", 2},
		{"a\xE2", 1},
		{"a\xE2\x82", 1},
		{"a\xE2\x82\xAC", 4},
		{"a\xE2A", 3}, // E2 is already known to be bad
		{"\xF0\x9F\x98", 0},
		{"\x80", 1},     // a stray continuation byte never completes
		{"\xED\xA0", 2}, // ED A0 can never be valid
		{"\xF4\x8F", 0}, // F4 8F can still become U+10FFFx
	} {
		if got := settled([]byte(c.in)); got != c.want {
			t.Errorf("settled(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// TestStreamHoldsIncomplete feeds an emoji whose four bytes are separate
// byte-level tokens: nothing may come out until the character completes.
func TestStreamHoldsIncomplete(t *testing.T) {
	tok := mustLoad(t, filepath.Join(fixtures, "tokenizers", "bytelevel", "tokenizer.json"))
	// One byte-level token per byte of "a😀b".
	var ids []int
	for _, b := range []byte("a😀b") {
		id, ok := tok.TokenID(string(byteToRune[b]))
		if !ok {
			t.Fatalf("no token for byte %#x", b)
		}
		ids = append(ids, id)
	}
	d := tok.NewStreamDecoder()
	var deltas []string
	for _, id := range ids {
		deltas = append(deltas, d.Add(id))
	}
	want := []string{"a", "", "", "", "😀", "b"}
	if strings.Join(deltas, "|") != strings.Join(want, "|") {
		t.Errorf("deltas %q, want %q", deltas, want)
	}
	if f := d.Flush(); f != "" {
		t.Errorf("Flush = %q, want empty", f)
	}

	// A sequence that ends inside a character: Flush gives what Decode
	// gives, one U+FFFD for the truncated sequence.
	cut := ids[:3] // "a", F0, 9F
	var got string
	for _, id := range cut {
		got += d.Add(id)
	}
	if got != "a" {
		t.Errorf("before Flush: %q, want %q", got, "a")
	}
	got += d.Flush()
	if want := tok.Decode(cut); got != want || want != "a\uFFFD" {
		t.Errorf("streamed %q, Decode %q, want %q", got, want, "a\uFFFD")
	}
}

// TestStreamRandom feeds random id sequences (most byte tokens split
// characters) to the stream decoder of every conformance tokenizer and
// checks it against Decode; every delta must be valid UTF-8 and no delta
// may be emitted that a later id changes.
func TestStreamRandom(t *testing.T) {
	for _, path := range []string{
		"tokenizers/bytelevel/tokenizer.json",
		"tokenizers/llama3split/tokenizer.json",
		"lfm2-audio-tiny/tokenizer.json",
	} {
		tok := mustLoad(t, filepath.Join(fixtures, path))
		rng := rand.New(rand.NewSource(1))
		n := tok.VocabSize()
		for iter := 0; iter < 2000; iter++ {
			ids := make([]int, 1+rng.Intn(16))
			for i := range ids {
				ids[i] = rng.Intn(n + 4) // a few unknown ids too
			}
			d := tok.NewStreamDecoder()
			var got string
			for k, id := range ids {
				delta := d.Add(id)
				if !utf8.ValidString(delta) {
					t.Fatalf("%s %v: delta %q is not valid UTF-8", path, ids, delta)
				}
				got += delta
				// What was emitted must stay a prefix of every later decode.
				if full := tok.Decode(ids[:k+1]); !strings.HasPrefix(full, got) {
					t.Fatalf("%s %v: emitted %q, but Decode of the first %d ids is %q", path, ids, got, k+1, full)
				}
			}
			got += d.Flush()
			if want := tok.Decode(ids); got != want {
				t.Fatalf("%s %v: streamed %q, Decode %q", path, ids, got, want)
			}
		}
	}
}
