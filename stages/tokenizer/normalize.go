package tokenizer

import (
	"strings"
	"unicode"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// A normalizer rewrites one piece of input text before pre-tokenization
// (tokenizers' Normalizer, without offset tracking: only ids matter here).
type normalizer interface {
	normalize(s string) string
}

type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string { return n.form.String(s) }

type normSequence []normalizer

func (seq normSequence) normalize(s string) string {
	for _, n := range seq {
		s = n.normalize(s)
	}
	return s
}

// prependNorm is Prepend: it prefixes every non-empty piece.
type prependNorm struct{ prefix string }

func (p prependNorm) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

// replaceNorm is Replace: every match of the pattern becomes content.
type replaceNorm struct {
	re      *regexp2.Regexp
	content string
}

func (r replaceNorm) normalize(s string) string {
	return replaceAll(r.re, s, r.content)
}

// replaceAll substitutes content for every match of re in s, with the
// Oniguruma iteration rules of regexSpans.
func replaceAll(re *regexp2.Regexp, s, content string) string {
	var b strings.Builder
	for _, sp := range regexSpans(re, s, nil) {
		if sp.match {
			b.WriteString(content)
		} else {
			b.WriteString(s[sp.start:sp.end])
		}
	}
	return b.String()
}

// lowercaseNorm is Lowercase: Rust's char::to_lowercase for every
// character. Only U+0130 lower-cases to two characters (SpecialCasing);
// the rest is the simple mapping Go's unicode.ToLower gives.
type lowercaseNorm struct{}

func (lowercaseNorm) normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == '\u0130' {
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// stripNorm is Strip: it removes leading and/or trailing whitespace.
type stripNorm struct{ left, right bool }

func (st stripNorm) normalize(s string) string {
	if st.left {
		s = strings.TrimLeftFunc(s, isWhitespace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, isWhitespace)
	}
	return s
}

// stripAccentsNorm is StripAccents: it drops combining marks.
type stripAccentsNorm struct{}

func (stripAccentsNorm) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsMark(r) {
			return -1
		}
		return r
	}, s)
}

// nmtNorm is Nmt: it drops some control characters and maps other
// code points to a space.
type nmtNorm struct{}

func (nmtNorm) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 0x01 && r <= 0x08, r == 0x0B, r >= 0x0E && r <= 0x1F,
			r == 0x7F, r == 0x8F, r == 0x9F:
			return -1
		case r == 0x09, r == 0x0A, r == 0x0C, r == 0x0D, r == 0x1680,
			r >= 0x200B && r <= 0x200F, r == 0x2028, r == 0x2029,
			r == 0x2581, r == 0xFEFF, r == 0xFFFD:
			return ' '
		}
		return r
	}, s)
}

// byteLevelNorm is the ByteLevel normalizer: every byte becomes its GPT-2
// character.
type byteLevelNorm struct{}

func (byteLevelNorm) normalize(s string) string { return byteLevelMap(s) }

// byteLevelMap spells every byte of s with GPT-2's byte-to-unicode table.
func byteLevelMap(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteToRune[s[i]])
	}
	return b.String()
}
