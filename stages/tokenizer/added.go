package tokenizer

import (
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's "added_tokens".
type addedToken struct {
	content    string
	id         int
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// addedMatcher finds added tokens in text as tokenizers' AddedVocabulary
// does with its Aho-Corasick automaton: leftmost-longest, non-overlapping
// matches, each then checked for single_word and widened by lstrip/rstrip.
type addedMatcher struct {
	nodes []trieNode
}

type trieNode struct {
	next map[byte]int32
	tok  *addedToken // token ending here, or nil
}

func newAddedMatcher(tokens []*addedToken) *addedMatcher {
	m := &addedMatcher{nodes: []trieNode{{}}}
	for _, t := range tokens {
		p := t.content
		n := 0
		for i := 0; i < len(p); i++ {
			nx, ok := m.nodes[n].next[p[i]]
			if !ok {
				if m.nodes[n].next == nil {
					m.nodes[n].next = make(map[byte]int32)
				}
				nx = int32(len(m.nodes))
				m.nodes[n].next[p[i]] = nx
				m.nodes = append(m.nodes, trieNode{})
			}
			n = int(nx)
		}
		m.nodes[n].tok = t
	}
	return m
}

// longestAt returns the longest token that starts at s[i:], and its end.
func (m *addedMatcher) longestAt(s string, i int) (*addedToken, int) {
	var best *addedToken
	end := 0
	n := 0
	for j := i; j < len(s); j++ {
		nx, ok := m.nodes[n].next[s[j]]
		if !ok {
			break
		}
		n = int(nx)
		if t := m.nodes[n].tok; t != nil {
			best, end = t, j+1
		}
	}
	return best, end
}

// segment is a piece of input text, or an added token (id >= 0).
type segment struct {
	text string
	id   int
}

// split appends to dst the segments of s: added tokens and the text
// between them. Empty text segments are left out. With skipSpecial,
// special tokens are not recognized: as in tokenizers (its
// encode_special_tokens), the automaton still moves past such a match, so
// no other token is found inside it.
func (m *addedMatcher) split(dst []segment, s string, skipSpecial bool) []segment {
	if m == nil || len(m.nodes[0].next) == 0 {
		if s != "" {
			dst = append(dst, segment{s, -1})
		}
		return dst
	}
	textStart := 0 // end of the last accepted match
	for i := 0; i < len(s); {
		if _, ok := m.nodes[0].next[s[i]]; !ok {
			i++
			continue
		}
		t, stop := m.longestAt(s, i)
		if t == nil {
			i++
			continue
		}
		start := i
		// The automaton moves past every match, also one single_word
		// then discards.
		i = stop
		if skipSpecial && t.special {
			continue
		}
		if t.singleWord {
			before, _ := utf8.DecodeLastRuneInString(s[:start])
			after, _ := utf8.DecodeRuneInString(s[stop:])
			if start > 0 && isWordChar(before) || stop < len(s) && isWordChar(after) {
				continue
			}
		}
		if t.lstrip {
			ns := start
			for ns > textStart {
				r, n := utf8.DecodeLastRuneInString(s[:ns])
				if !isWhitespace(r) {
					break
				}
				ns -= n
			}
			start = ns
		}
		if t.rstrip {
			for stop < len(s) {
				r, n := utf8.DecodeRuneInString(s[stop:])
				if !isWhitespace(r) {
					break
				}
				stop += n
			}
		}
		if textStart < start {
			dst = append(dst, segment{s[textStart:start], -1})
		}
		dst = append(dst, segment{s[start:stop], t.id})
		textStart = stop
	}
	if textStart < len(s) {
		dst = append(dst, segment{s[textStart:], -1})
	}
	return dst
}
