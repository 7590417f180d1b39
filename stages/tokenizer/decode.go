package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// A decoder turns the tokens of a sequence of ids back into text pieces
// (tokenizers' Decoder::decode_chain); the pieces are then concatenated.
type decoder interface {
	decodeChain(tokens []string) []string
}

// byteLevelDec is ByteLevel: tokens spelled in GPT-2 characters become
// their bytes (a token with any other character stays as its UTF-8
// bytes), and all bytes are read as UTF-8 with U+FFFD for ill-formed
// sequences.
type byteLevelDec struct{}

func (byteLevelDec) decodeChain(tokens []string) []string {
	var b []byte
	for _, t := range tokens {
		b = appendTokenBytes(b, t)
	}
	return []string{string(appendLossy(nil, b))}
}

// appendTokenBytes appends the bytes a byte-level token spells.
func appendTokenBytes(dst []byte, tok string) []byte {
	n := len(dst)
	for _, r := range tok {
		c, ok := runeToByte[r]
		if !ok {
			return append(dst[:n], tok...)
		}
		dst = append(dst, c)
	}
	return dst
}

type decSequence []decoder

func (seq decSequence) decodeChain(tokens []string) []string {
	for _, d := range seq {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

// fuseDec is Fuse: all tokens become one.
type fuseDec struct{}

func (fuseDec) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// replaceDec is Replace as a decoder: every match in every token becomes
// content.
type replaceDec struct {
	re      *regexp2.Regexp
	content string
}

func (r replaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = replaceAll(r.re, t, r.content)
	}
	return out
}

// stripDec is Strip: up to start leading and stop trailing copies of
// content are cut from every token.
type stripDec struct {
	content     rune
	start, stop int
}

func (s stripDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rs := []rune(t)
		lo := 0
		for lo < s.start && lo < len(rs) && rs[lo] == s.content {
			lo++
		}
		hi := len(rs)
		for k := 0; k < s.stop && hi > lo && rs[hi-1] == s.content; k++ {
			hi--
		}
		out[i] = string(rs[lo:hi])
	}
	return out
}

// byteFallbackDec is ByteFallback: runs of "<0xNN>" tokens become their
// bytes if those are valid UTF-8, and one U+FFFD per byte otherwise.
type byteFallbackDec struct{}

func (byteFallbackDec) decodeChain(tokens []string) []string {
	var out []string
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if s := string(run); utf8.Valid(run) {
			out = append(out, s)
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range tokens {
		if b, ok := fallbackByte(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// fallbackByte reads a "<0xNN>" token as Rust's u8::from_str_radix does
// (which also takes a leading '+').
func fallbackByte(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	digits := t[3:5]
	if digits[0] == '+' {
		digits = digits[1:]
	}
	v, err := strconv.ParseUint(digits, 16, 8)
	if err != nil || strings.HasPrefix(digits, "+") || strings.HasPrefix(digits, "-") {
		return 0, false
	}
	return byte(v), true
}

// bpeDec is BPEDecoder: the end-of-word suffix becomes a space, or
// nothing on the last token.
type bpeDec struct{ suffix string }

func (d bpeDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rep := " "
		if i == len(tokens)-1 {
			rep = ""
		}
		out[i] = strings.ReplaceAll(t, d.suffix, rep)
	}
	return out
}
