package tokenizer

import (
	"fmt"
	"sync"
	"unicode/utf8"
)

// bpe is tokenizers' BPE model: characters looked up in the vocabulary,
// then merged pairwise, lowest merge rank first, leftmost first among
// equal ranks.
type bpe struct {
	vocab        map[string]int
	tokens       map[int]string   // id -> token
	merges       map[uint64]merge // key: left id << 32 | right id
	unk          int              // id of unk_token, or -1
	prefix       string           // continuing_subword_prefix
	suffix       string           // end_of_word_suffix
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	byteIDs      [256]int // ids of "<0xNN>" tokens, -1 when absent

	mu    sync.RWMutex
	cache map[string][]int
}

type merge struct{ rank, id int32 }

// The word cache follows tokenizers': words shorter than cacheMaxLen bytes,
// until cacheCapacity entries are stored.
const (
	cacheCapacity = 10000
	cacheMaxLen   = 256
)

func pairKey(a, b int) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// appendTokens appends the ids of word to dst. A stop (c) inside the
// merges leaves dst with a partial word; the caller discards it.
func (m *bpe) appendTokens(dst []int, word string, c *canceller) []int {
	if word == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(dst, id)
		}
	}
	m.mu.RLock()
	ids, ok := m.cache[word]
	m.mu.RUnlock()
	if ok {
		return append(dst, ids...)
	}
	ids = m.mergeWord(word, c)
	if c.stopped() {
		return dst // not cached: the merges stopped short
	}
	if len(word) < cacheMaxLen {
		m.mu.Lock()
		if len(m.cache) < cacheCapacity {
			m.cache[word] = ids
		}
		m.mu.Unlock()
	}
	return append(dst, ids...)
}

// symbol is one piece of a word being merged; a merged-away symbol has
// length 0.
type symbol struct {
	id         int
	prev, next int
	len        int
}

// mergeWord splits word into vocabulary characters (with unk and byte
// fallback as configured) and applies the merges.
func (m *bpe) mergeWord(word string, c *canceller) []int {
	syms := make([]symbol, 0, len(word))
	add := func(id, n int) {
		prev := len(syms) - 1
		if prev >= 0 {
			syms[prev].next = len(syms)
		}
		syms = append(syms, symbol{id: id, prev: prev, next: -1, len: n})
	}
	unkID, unkLen := -1, 0 // pending unknown run
	for i, r := range word {
		if c.stopped() {
			return nil
		}
		n := utf8.RuneLen(r)
		s := word[i : i+n]
		if i > 0 && m.prefix != "" {
			s = m.prefix + s
		}
		if i+n == len(word) && m.suffix != "" {
			s += m.suffix
		}
		if id, ok := m.vocab[s]; ok {
			if unkID >= 0 {
				add(unkID, unkLen)
				unkID = -1
			}
			add(id, n)
			continue
		}
		if m.byteFallback && m.addBytes(s, add) {
			continue
		}
		if m.unk >= 0 {
			switch {
			case unkID >= 0 && m.fuseUnk:
				unkLen += n
			case unkID >= 0:
				add(unkID, unkLen)
				unkID, unkLen = m.unk, n
			default:
				unkID, unkLen = m.unk, n
			}
		}
		// Without unk_token an unknown character yields no token.
	}
	if unkID >= 0 {
		add(unkID, unkLen)
	}
	m.mergeAll(syms, c)
	ids := make([]int, 0, len(syms))
	for _, s := range syms {
		if s.len != 0 {
			ids = append(ids, s.id)
		}
	}
	return ids
}

// addBytes adds the byte-fallback tokens of s if all of them exist.
func (m *bpe) addBytes(s string, add func(id, n int)) bool {
	for i := 0; i < len(s); i++ {
		if m.byteIDs[s[i]] < 0 {
			return false
		}
	}
	for i := 0; i < len(s); i++ {
		add(m.byteIDs[s[i]], 1)
	}
	return true
}

// mergeAll applies merges with a priority queue of (rank, position), as
// tokenizers' Word::merge_all does (without dropout). It stops early,
// leaving syms half merged, when c says so.
func (m *bpe) mergeAll(syms []symbol, c *canceller) {
	var q mergeQueue
	for i := 0; i+1 < len(syms); i++ {
		if c.stopped() {
			return
		}
		if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			q.push(queued{pos: int32(i), merge: mg})
		}
	}
	for len(q) > 0 {
		if c.stopped() {
			return
		}
		top := q.pop()
		cur := &syms[top.pos]
		if cur.len == 0 || cur.next == -1 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		// Skip stale entries: the pair at pos must still make this token.
		if mg, ok := m.merges[pairKey(cur.id, right.id)]; !ok || mg.id != top.id {
			continue
		}
		cur.id = int(top.id)
		cur.len += right.len
		cur.next = right.next
		syms[nextPos].len = 0
		if right.next >= 0 && right.next < len(syms) {
			syms[right.next].prev = int(top.pos)
		}
		if cur.prev >= 0 {
			if mg, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				q.push(queued{pos: int32(cur.prev), merge: mg})
			}
		}
		if cur.next >= 0 && cur.next < len(syms) {
			if mg, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				q.push(queued{pos: top.pos, merge: mg})
			}
		}
	}
}

type queued struct {
	pos int32
	merge
}

func (a queued) less(b queued) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

// mergeQueue is a binary min-heap of queued merges.
type mergeQueue []queued

func (q *mergeQueue) push(x queued) {
	*q = append(*q, x)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *mergeQueue) pop() queued {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l].less(h[m]) {
			m = l
		}
		if r < len(h) && h[r].less(h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// newBPE checks the merges against the vocabulary and builds the model.
// merges are in rank order; a pair listed twice keeps its last rank, as in
// tokenizers.
func newBPE(vocab map[string]int, merges [][2]string, cfg bpeConfig) (*bpe, error) {
	m := &bpe{
		vocab:        vocab,
		merges:       make(map[uint64]merge, len(merges)),
		unk:          -1,
		fuseUnk:      cfg.FuseUnk,
		byteFallback: cfg.ByteFallback,
		ignoreMerges: cfg.IgnoreMerges,
		cache:        make(map[string][]int),
	}
	if cfg.ContinuingSubwordPrefix != nil {
		m.prefix = *cfg.ContinuingSubwordPrefix
	}
	if cfg.EndOfWordSuffix != nil {
		m.suffix = *cfg.EndOfWordSuffix
	}
	if cfg.UnkToken != nil {
		// tokenizers only fails when an unknown character needs the unk
		// token; a missing one is a broken file either way.
		id, ok := vocab[*cfg.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", *cfg.UnkToken)
		}
		m.unk = id
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	for rank, mg := range merges {
		a, ok := vocab[mg[0]]
		if !ok {
			return nil, fmt.Errorf("merge %d (%q %q): %q is not in the vocabulary", rank, mg[0], mg[1], mg[0])
		}
		b, ok := vocab[mg[1]]
		if !ok {
			return nil, fmt.Errorf("merge %d (%q %q): %q is not in the vocabulary", rank, mg[0], mg[1], mg[1])
		}
		right := mg[1]
		if len(m.prefix) <= len(right) {
			right = right[len(m.prefix):]
		}
		id, ok := vocab[mg[0]+right]
		if !ok {
			return nil, fmt.Errorf("merge %d (%q %q): result %q is not in the vocabulary", rank, mg[0], mg[1], mg[0]+right)
		}
		m.merges[pairKey(a, b)] = merge{rank: int32(rank), id: int32(id)}
	}
	return m, nil
}
