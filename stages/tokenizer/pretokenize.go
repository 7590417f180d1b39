package tokenizer

import (
	"strings"

	"github.com/dlclark/regexp2"
)

// A preTokenizer splits one piece of normalized text into smaller pieces
// (and may rewrite them, as ByteLevel does). It appends the non-empty
// results to dst. The regex pre-tokenizers stop short when c says so (the
// encode is then abandoned).
type preTokenizer interface {
	split(dst []string, piece string, c *canceller) []string
}

// preTokSequence runs each pre-tokenizer over all pieces the previous one
// produced.
type preTokSequence []preTokenizer

func (seq preTokSequence) split(dst []string, piece string, c *canceller) []string {
	pieces := []string{piece}
	var next []string
	for _, p := range seq {
		next = next[:0]
		for _, s := range pieces {
			next = p.split(next, s, c)
		}
		pieces, next = next, pieces
	}
	return append(dst, pieces...)
}

// gpt2Pattern is the ByteLevel pre-tokenizer's built-in regex.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

var gpt2Regex = regexp2.MustCompile(gpt2Pattern, regexOptions)

// byteLevelPreTok is ByteLevel: an optional leading space, the GPT-2
// split, then every byte spelled as its GPT-2 character.
type byteLevelPreTok struct {
	addPrefixSpace bool
	useRegex       bool
}

func (b byteLevelPreTok) split(dst []string, piece string, c *canceller) []string {
	if b.addPrefixSpace && !strings.HasPrefix(piece, " ") {
		piece = " " + piece
	}
	n := len(dst)
	if b.useRegex {
		dst = splitSpans(dst, piece, regexSpans(gpt2Regex, piece, c), isolated)
	} else if piece != "" {
		dst = append(dst, piece)
	}
	for i := n; i < len(dst); i++ {
		dst[i] = byteLevelMap(dst[i])
	}
	return dst
}

// splitPreTok is Split: a regex (or an escaped literal) and a behavior.
type splitPreTok struct {
	re     *regexp2.Regexp
	b      behavior
	invert bool
}

func (s splitPreTok) split(dst []string, piece string, c *canceller) []string {
	spans := regexSpans(s.re, piece, c)
	if s.invert {
		spans = invertSpans(spans)
	}
	return splitSpans(dst, piece, spans, s.b)
}

// funcPreTok splits on the characters a predicate selects (Digits,
// Punctuation, WhitespaceSplit, CharDelimiterSplit).
type funcPreTok struct {
	f func(rune) bool
	b behavior
}

func (p funcPreTok) split(dst []string, piece string, c *canceller) []string {
	return splitSpans(dst, piece, funcSpans(p.f, piece), p.b)
}

// whitespacePreTok is Whitespace: the pieces are the runs of \w+ and of
// [^\w\s]+ (Rust regex classes); whitespace is dropped.
type whitespacePreTok struct{}

func (whitespacePreTok) split(dst []string, piece string, c *canceller) []string {
	const (
		space = iota
		word
		other
	)
	class := func(r rune) int {
		switch {
		case isWordChar(r):
			return word
		case isWhitespace(r):
			return space
		}
		return other
	}
	start, cur := 0, space
	for i, r := range piece {
		c := class(r)
		if c == cur {
			continue
		}
		if cur != space && i > start {
			dst = append(dst, piece[start:i])
		}
		start, cur = i, c
	}
	if cur != space && len(piece) > start {
		dst = append(dst, piece[start:])
	}
	return dst
}

// bertPreTok is BertPreTokenizer: split on whitespace (dropped), then
// isolate every punctuation character.
type bertPreTok struct{}

func (bertPreTok) split(dst []string, piece string, c *canceller) []string {
	for _, w := range splitSpans(nil, piece, funcSpans(isWhitespace, piece), removed) {
		dst = splitSpans(dst, w, funcSpans(isPunctuation, w), isolated)
	}
	return dst
}
