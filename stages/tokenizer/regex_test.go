package tokenizer

import (
	"reflect"
	"strings"
	"testing"
)

func TestTranslateRegex(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`'s|\s+(?!\S)|\s+`, `'s|\s+(?!\S)|\s+`},
		{`\p{L}++`, `(?>\p{L}+)`},
		{`[^\r\n\p{L}\p{N}]?+\p{L}+`, `(?>[^\r\n\p{L}\p{N}]?)\p{L}+`},
		{`(ab)*+c`, `(?>(ab)*)c`},
		{`\p{N}{1,3}+`, `(?:\p{N}{1,3})+`},
		{`a{2}?b{2,}?`, `(?:a{2})?b{2,}?`},
		{`a{,3}`, `a{0,3}`},
		{`a{x}`, `a{x}`},
		{`a*?b+?`, `a*?b+?`},
		{`\x{4E00}\x{41}\x{1F600}`, "\\u4E00\\x41\U0001F600"},
		{`\h+\H`, `[0-9a-fA-F]+[^0-9a-fA-F]`},
		{`[\h_]`, `[0-9a-fA-F_]`},
		{`\p{^L}\P{^N}`, `\P{L}\p{N}`},
		{`(?m:.)(?im)`, `(?s:.)(?is)`},
		{`\w\W[\w']`, `[` + wordClass + `][^` + wordClass + `][` + wordClass + `']`},
		{`[]a]`, `[\]a]`},
		{`\u0041\cA\k<n>\12`, `\u0041\cA\k<n>\12`},
	} {
		got, err := translateRegex(c.in)
		if err != nil {
			t.Errorf("translateRegex(%q): %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("translateRegex(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	for _, bad := range []string{`[[:alpha:]]`, `[a[b]]`, `[a-z&&[^x]]`, `\`, `[ab`, `\x{110000}`, `\x{41`} {
		if got, err := translateRegex(bad); err == nil {
			t.Errorf("translateRegex(%q) = %q, want an error", bad, got)
		}
	}
}

// TestRegexSpans checks byte offsets (regexp2 reports runes) and
// Oniguruma's rule for empty matches.
func TestRegexSpans(t *testing.T) {
	for _, c := range []struct {
		pattern, text string
		want          []span
	}{
		{gpt2Pattern, "日本 語", []span{{0, 6, true}, {6, 10, true}}},
		{gpt2Pattern, "", []span{{0, 0, false}}},
		// An empty match right after a match is skipped.
		{`a*`, "ab", []span{{0, 1, true}, {1, 2, false}, {2, 2, true}}},
		{`x*`, "ab", []span{{0, 0, true}, {0, 1, false}, {1, 1, true}, {1, 2, false}, {2, 2, true}}},
		// Case-insensitive contractions, the Llama 3 way.
		{`(?i:'s|'ll)`, "IT'S we'LL", []span{{0, 2, false}, {2, 4, true}, {4, 7, false}, {7, 10, true}}},
		// '$' is a line anchor in Oniguruma.
		{`a$`, "a\na", []span{{0, 1, true}, {1, 2, false}, {2, 3, true}}},
	} {
		re, err := compileRegex(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := regexSpans(re, c.text, nil); !reflect.DeepEqual(got, c.want) {
			t.Errorf("regexSpans(%q, %q) = %v, want %v", c.pattern, c.text, got, c.want)
		}
	}
}

// TestSplitBehaviors runs every behavior on one set of spans.
func TestSplitBehaviors(t *testing.T) {
	const s = "a--b-c"
	spans := funcSpans(func(r rune) bool { return r == '-' }, s)
	for _, c := range []struct {
		b    behavior
		want string
	}{
		{removed, "a|b|c"},
		{isolated, "a|-|-|b|-|c"},
		{mergedWithPrevious, "a-|-|b-|c"},
		{mergedWithNext, "a|-|-b|-c"},
		{contiguous, "a|--|b|-|c"},
	} {
		if got := strings.Join(splitSpans(nil, s, spans, c.b), "|"); got != c.want {
			t.Errorf("behavior %d: %q, want %q", c.b, got, c.want)
		}
	}
	inv := invertSpans(funcSpans(func(r rune) bool { return r == '-' }, s))
	if got := strings.Join(splitSpans(nil, s, inv, mergedWithNext), "|"); got != "a-|-|b-|c" {
		t.Errorf("inverted MergedWithNext: %q", got)
	}
}
