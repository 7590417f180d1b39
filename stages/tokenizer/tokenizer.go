// Package tokenizer implements the Hugging Face tokenizers pipeline for
// byte-level BPE tokenizer.json files (the LFM2 family, GPT-2, Llama 3,
// Qwen): it encodes text to the ids tokenizers' encode(text,
// add_special_tokens=False) gives and decodes ids to the text of
// decode(ids, skip_special_tokens=False), bit for bit.
//
// Encoding follows the file as written: added tokens are cut out of the
// raw text first (leftmost-longest, with their single_word, lstrip, rstrip
// and normalized flags), the rest is normalized, split by the declared
// pre-tokenizer chain and tokenized by the BPE model. Components this
// package does not implement are refused by name when the file is loaded.
//
// EncodeContext encodes untrusted text: with EncodeOptions.SplitSpecial
// a special token spelled in the text is plain text (tokenizers'
// encode_special_tokens), and a long encode stops when its context ends.
//
// A Tokenizer is safe for concurrent use.
package tokenizer

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// Tokenizer encodes and decodes text with one tokenizer.json.
type Tokenizer struct {
	normalizer normalizer   // nil: none
	preTok     preTokenizer // nil: the whole piece is one word
	model      *bpe
	decoder    decoder // nil: tokens joined with spaces

	added      map[string]*addedToken // by content
	addedByID  map[int]*addedToken
	decodeForm map[int]string // normalized content of normalized added tokens
	special    map[string]bool
	rawAdded   *addedMatcher // tokens matched in the raw text
	normAdded  *addedMatcher // tokens matched in the normalized text

	stream          streamMode
	byteFallbackDec bool // the decoder chain has ByteFallback
}

// Load reads and parses a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	return t, nil
}

// Encode returns the ids of text, without special tokens added around it
// (tokenizers' encode(text, add_special_tokens=False)). Added tokens that
// appear in text, special or not, are recognized. Ill-formed UTF-8 in
// text is read as U+FFFD first, as Python's bytes.decode(errors="replace").
func (t *Tokenizer) Encode(text string) []int {
	ids, _ := t.encode(text, EncodeOptions{}, nil) // without a canceller it cannot fail
	return ids
}

// EncodeOptions change how EncodeContext reads its text.
type EncodeOptions struct {
	// SplitSpecial leaves special added tokens unrecognized: text that
	// spells one (a client's "<|im_end|>") is encoded as the plain text it
	// is, as tokenizers' encode_special_tokens flag does (what
	// transformers' encode(text, split_special_tokens=True) sets).
	// Non-special added tokens are still recognized, as there. Text from
	// untrusted sources is encoded this way so that it cannot forge
	// control tokens.
	SplitSpecial bool
}

// EncodeContext is Encode with options, abandoned when ctx ends: the
// pre-tokenizer and the BPE model look at ctx every few hundred matches,
// words and merges, and EncodeContext then returns nil and ctx's cause
// (context.Cause). A normalizer's pass over a piece is not interrupted
// (they are linear in its length).
func (t *Tokenizer) EncodeContext(ctx context.Context, text string, opts EncodeOptions) ([]int, error) {
	return t.encode(text, opts, newCanceller(ctx))
}

func (t *Tokenizer) encode(text string, opts EncodeOptions, c *canceller) ([]int, error) {
	if c.stopped() {
		return nil, c.err
	}
	text = lossyString(text)
	var ids []int
	var words []string
	for _, seg := range t.rawAdded.split(nil, text, opts.SplitSpecial) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			continue
		}
		s := seg.text
		if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		for _, seg := range t.normAdded.split(nil, s, opts.SplitSpecial) {
			if seg.id >= 0 {
				ids = append(ids, seg.id)
				continue
			}
			words = words[:0]
			if t.preTok != nil {
				words = t.preTok.split(words, seg.text, c)
			} else {
				words = append(words, seg.text)
			}
			for _, w := range words {
				if c.stopped() {
					return nil, c.err
				}
				ids = t.model.appendTokens(ids, w, c)
			}
		}
	}
	if c.stopped() { // a stop inside the last word's merges or split
		return nil, c.err
	}
	return ids, nil
}

// checkEvery is how many steps (regex matches, words, merges) an encode
// takes between looks at its context.
const checkEvery = 256

// testHookCheck, when set (by tests), runs before each look at a
// canceller's context.
var testHookCheck func()

// canceller tells a long encode that its caller gave up. A nil canceller
// never stops. It belongs to one encode (one goroutine).
type canceller struct {
	ctx  context.Context
	done <-chan struct{}
	n    int
	err  error // set once stopped: the context's cause
}

// newCanceller watches ctx, or returns nil for a context that never ends.
func newCanceller(ctx context.Context) *canceller {
	done := ctx.Done()
	if done == nil {
		return nil
	}
	return &canceller{ctx: ctx, done: done, n: checkEvery - 1} // the first call looks
}

// stopped reports whether the encode should stop, looking at the context
// on every checkEvery-th call.
func (c *canceller) stopped() bool {
	if c == nil {
		return false
	}
	if c.err != nil {
		return true
	}
	if c.n++; c.n < checkEvery {
		return false
	}
	c.n = 0
	if testHookCheck != nil {
		testHookCheck()
	}
	select {
	case <-c.done:
		c.err = context.Cause(c.ctx)
		return true
	default:
		return false
	}
}

// Decode returns the text of ids (tokenizers' decode(ids,
// skip_special_tokens=False)). Ids the tokenizer does not know are
// skipped, as tokenizers does.
func (t *Tokenizer) Decode(ids []int) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if tok, ok := t.token(id); ok {
			tokens = append(tokens, tok)
		}
	}
	return t.decodeTokens(tokens)
}

func (t *Tokenizer) decodeTokens(tokens []string) string {
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decodeChain(tokens), "")
}

// token is the string decoding starts from for id.
func (t *Tokenizer) token(id int) (string, bool) {
	if form, ok := t.decodeForm[id]; ok {
		return form, true
	}
	if tok, ok := t.addedByID[id]; ok {
		return tok.content, true
	}
	tok, ok := t.model.tokens[id]
	return tok, ok
}

// Token returns the token string of id as tokenizers' id_to_token does
// (byte-level tokens are spelled in GPT-2 characters, e.g. "Ġthe"), or ""
// if id is unknown.
func (t *Tokenizer) Token(id int) string {
	tok, _ := t.token(id)
	return tok
}

// TokenID returns the id of a token string (an added token's content or a
// vocabulary entry), as tokenizers' token_to_id does.
func (t *Tokenizer) TokenID(s string) (int, bool) {
	if tok, ok := t.added[s]; ok {
		return tok.id, true
	}
	id, ok := t.model.vocab[s]
	return id, ok
}

// IsSpecial reports whether id is an added token marked special (those
// decode(skip_special_tokens=True) would drop).
func (t *Tokenizer) IsSpecial(id int) bool {
	tok, ok := t.addedByID[id]
	return ok && t.special[tok.content]
}

// VocabSize is tokenizers' get_vocab_size(with_added_tokens=True): the
// model's vocabulary plus the added tokens it does not contain.
func (t *Tokenizer) VocabSize() int {
	n := len(t.model.vocab)
	for s := range t.added {
		if _, ok := t.model.vocab[s]; !ok {
			n++
		}
	}
	return n
}
