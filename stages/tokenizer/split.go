package tokenizer

import (
	"fmt"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// span is a piece of a string in byte offsets, flagged when it is a match
// of the pattern that produced it. A pattern's spans cover the string in
// order, as tokenizers' Pattern::find_matches does.
type span struct {
	start, end int
	match      bool
}

// behavior is tokenizers' SplitDelimiterBehavior: what becomes of the
// matched delimiters when a string is split.
type behavior uint8

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviorNames = map[string]behavior{
	"Removed":            removed,
	"Isolated":           isolated,
	"MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext":     mergedWithNext,
	"Contiguous":         contiguous,
}

func parseBehavior(name string) (behavior, error) {
	b, ok := behaviorNames[name]
	if !ok {
		return 0, fmt.Errorf("unknown split behavior %q (want Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)", name)
	}
	return b, nil
}

// regexSpans finds the matches of re in s the way tokenizers iterates
// Oniguruma matches: an empty match that ends where the previous match
// ended is skipped, and the search moves on by one character. When c
// says stop, the spans end short (the encode is abandoned).
func regexSpans(re *regexp2.Regexp, s string, c *canceller) []span {
	if s == "" {
		return []span{{0, 0, false}}
	}
	runes := []rune(s)
	// off[i] is the byte offset of rune i; off[len(runes)] = len(s).
	off := make([]int, len(runes)+1)
	b := 0
	for i, r := range runes {
		off[i] = b
		b += utf8.RuneLen(r)
	}
	off[len(runes)] = b

	var spans []span
	prev := 0
	lastEnd, lastMatchEnd := 0, -1
	for lastEnd <= len(runes) {
		if c.stopped() {
			return spans
		}
		m, err := re.FindRunesMatchStartingAt(runes, lastEnd)
		if err != nil || m == nil {
			// regexp2 only fails on a timeout, and none is set.
			break
		}
		st, en := m.Index, m.Index+m.Length
		if st == en && en == lastMatchEnd {
			lastEnd++
			continue
		}
		lastEnd, lastMatchEnd = en, en
		if prev != st {
			spans = append(spans, span{off[prev], off[st], false})
		}
		spans = append(spans, span{off[st], off[en], true})
		prev = en
	}
	if prev != len(runes) {
		spans = append(spans, span{off[prev], len(s), false})
	}
	return spans
}

// funcSpans makes every character for which f holds a match of its own.
func funcSpans(f func(rune) bool, s string) []span {
	if s == "" {
		return []span{{0, 0, false}}
	}
	var spans []span
	last := 0
	for i, r := range s {
		if f(r) {
			if last < i {
				spans = append(spans, span{last, i, false})
			}
			n := utf8.RuneLen(r)
			spans = append(spans, span{i, i + n, true})
			last = i + n
		}
	}
	if last < len(s) {
		spans = append(spans, span{last, len(s), false})
	}
	return spans
}

// invertSpans flips every span's match flag.
func invertSpans(spans []span) []span {
	for i := range spans {
		spans[i].match = !spans[i].match
	}
	return spans
}

// splitSpans applies behavior b to the spans of s and appends the
// resulting non-empty pieces to dst (NormalizedString::split followed by
// PreTokenizedString::split's removal of empty pieces).
func splitSpans(dst []string, s string, spans []span, b behavior) []string {
	type piece struct {
		start, end int
		remove     bool
	}
	var pieces []piece
	switch b {
	case isolated:
		for _, sp := range spans {
			pieces = append(pieces, piece{sp.start, sp.end, false})
		}
	case removed:
		for _, sp := range spans {
			pieces = append(pieces, piece{sp.start, sp.end, sp.match})
		}
	case contiguous:
		prevMatch := false
		for _, sp := range spans {
			if sp.match == prevMatch && len(pieces) > 0 {
				pieces[len(pieces)-1].end = sp.end
			} else {
				pieces = append(pieces, piece{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
	case mergedWithPrevious:
		prevMatch := false
		for _, sp := range spans {
			if sp.match && !prevMatch && len(pieces) > 0 {
				pieces[len(pieces)-1].end = sp.end
			} else {
				pieces = append(pieces, piece{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
	case mergedWithNext:
		prevMatch := false
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prevMatch && len(pieces) > 0 {
				pieces[len(pieces)-1].start = sp.start
			} else {
				pieces = append(pieces, piece{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
		for i, j := 0, len(pieces)-1; i < j; i, j = i+1, j-1 {
			pieces[i], pieces[j] = pieces[j], pieces[i]
		}
	}
	for _, p := range pieces {
		if !p.remove && p.end > p.start {
			dst = append(dst, s[p.start:p.end])
		}
	}
	return dst
}
