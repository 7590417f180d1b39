package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// This file reads tokenizer.json. Every component is built from the type
// the file names; a type this package does not implement is refused by
// name, never replaced by a guess.

type fileJSON struct {
	Version      *string          `json:"version"`
	AddedTokens  []addedTokenJSON `json:"added_tokens"`
	Normalizer   json.RawMessage  `json:"normalizer"`
	PreTokenizer json.RawMessage  `json:"pre_tokenizer"`
	Model        json.RawMessage  `json:"model"`
	Decoder      json.RawMessage  `json:"decoder"`
	// post_processor, truncation and padding only act when special tokens
	// are added or batches are padded, which Encode never does.
}

type addedTokenJSON struct {
	ID         *int64  `json:"id"`
	Content    *string `json:"content"`
	SingleWord bool    `json:"single_word"`
	LStrip     bool    `json:"lstrip"`
	RStrip     bool    `json:"rstrip"`
	Normalized *bool   `json:"normalized"`
	Special    bool    `json:"special"`
}

type bpeConfig struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// pattern is Split's and Replace's {"String": ...} or {"Regex": ...}.
type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p *pattern) compile() (*regexp2.Regexp, error) {
	switch {
	case p == nil || p.String == nil && p.Regex == nil:
		return nil, errors.New(`pattern needs "String" or "Regex"`)
	case p.String != nil && p.Regex != nil:
		return nil, errors.New(`pattern has both "String" and "Regex"`)
	case p.String != nil:
		// tokenizers escapes the string into a regex; a literal needs no
		// translation.
		re, err := regexp2.Compile(escapeLiteral(*p.String), regexOptions)
		if err != nil {
			return nil, fmt.Errorf("string pattern %q: %w", *p.String, err)
		}
		return re, nil
	default:
		return compileRegex(*p.Regex)
	}
}

// isNull reports whether a component is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// componentType reads the "type" of a component object.
func componentType(raw json.RawMessage) (string, error) {
	var c struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", err
	}
	if c.Type == nil {
		return "", errors.New(`missing "type"`)
	}
	return *c.Type, nil
}

// Parse builds a Tokenizer from the contents of a tokenizer.json file. An
// error names the component at fault ("pre_tokenizer: Sequence[1]:
// unsupported type \"Metaspace\""); the caller adds which file it was.
func Parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	if f.Version != nil && *f.Version != "1.0" {
		return nil, fmt.Errorf("unknown version %q (want \"1.0\")", *f.Version)
	}
	t := &Tokenizer{}
	var err error
	if isNull(f.Model) {
		return nil, errors.New("model: missing")
	}
	if t.model, err = parseModel(f.Model); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if !isNull(f.Normalizer) {
		if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
			return nil, fmt.Errorf("normalizer: %w", err)
		}
	}
	if !isNull(f.PreTokenizer) {
		if t.preTok, err = parsePreTokenizer(f.PreTokenizer); err != nil {
			return nil, fmt.Errorf("pre_tokenizer: %w", err)
		}
	}
	if !isNull(f.Decoder) {
		if t.decoder, err = parseDecoder(f.Decoder); err != nil {
			return nil, fmt.Errorf("decoder: %w", err)
		}
	}
	if err := t.addTokens(f.AddedTokens); err != nil {
		return nil, err
	}
	t.stream = streamKind(t.decoder)
	for _, d := range flatten(nil, t.decoder) {
		if _, ok := d.(byteFallbackDec); ok {
			t.byteFallbackDec = true
		}
	}
	return t, nil
}

func parseModel(raw json.RawMessage) (*bpe, error) {
	// One pass over the (large) model object: "type" is read with the rest.
	var cfg bpeConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, err
	}
	switch cfg.Type {
	case "BPE":
	case "":
		return nil, errors.New(`missing "type"`)
	default:
		return nil, fmt.Errorf("unsupported type %q (only BPE is implemented)", cfg.Type)
	}
	if cfg.Dropout != nil && *cfg.Dropout != 0 {
		if *cfg.Dropout < 0 || *cfg.Dropout > 1 {
			return nil, fmt.Errorf("BPE: dropout %v outside [0, 1]", *cfg.Dropout)
		}
		return nil, fmt.Errorf("BPE: dropout %v is not supported (it makes encoding random)", *cfg.Dropout)
	}
	if isNull(cfg.Vocab) || isNull(cfg.Merges) {
		return nil, errors.New("BPE: missing vocab or merges")
	}
	vocab, tokens, err := parseVocab(cfg.Vocab)
	if err != nil {
		return nil, fmt.Errorf("BPE vocab: %w", err)
	}
	merges, err := parseMerges(cfg.Merges)
	if err != nil {
		return nil, fmt.Errorf("BPE merges: %w", err)
	}
	m, err := newBPE(vocab, merges, cfg)
	if err != nil {
		return nil, fmt.Errorf("BPE: %w", err)
	}
	m.tokens = tokens
	return m, nil
}

// parseVocab reads the vocabulary object and its reverse. Where two
// tokens share an id (tokenizers then keeps an arbitrary one), the
// lexically smaller token is kept, so the choice is at least stable.
func parseVocab(raw json.RawMessage) (map[string]int, map[int]string, error) {
	var v map[string]json.Number
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, nil, errors.New("want an object of token: id")
	}
	ids := make(map[string]int, len(v))
	tokens := make(map[int]string, len(v))
	for tok, num := range v {
		id, err := num.Int64()
		if err != nil || id < 0 || id > math.MaxInt32 {
			return nil, nil, fmt.Errorf("token %q: id %s is not an integer in [0, %d]", tok, num, math.MaxInt32)
		}
		ids[tok] = int(id)
		if old, ok := tokens[int(id)]; !ok || tok < old {
			tokens[int(id)] = tok
		}
	}
	return ids, tokens, nil
}

// parseMerges reads merges as ["a b", ...] or [["a", "b"], ...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	const want = `want a list of "a b" strings or of ["a", "b"] pairs`
	body := bytes.TrimSpace(raw)
	if len(body) < 2 || body[0] != '[' {
		return nil, errors.New(want)
	}
	if first := bytes.TrimSpace(body[1:]); len(first) > 0 && first[0] == '[' {
		var pairs [][2]string
		if err := json.Unmarshal(raw, &pairs); err != nil {
			return nil, errors.New(want)
		}
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, errors.New(want)
	}
	pairs := make([][2]string, 0, len(lines))
	for _, l := range lines {
		if strings.HasPrefix(l, "#version") {
			continue
		}
		a, b, ok := strings.Cut(l, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("merge %d %q is not two tokens separated by one space", len(pairs)+1, l)
		}
		pairs = append(pairs, [2]string{a, b})
	}
	return pairs, nil
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	typ, err := componentType(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNorm{}, nil
	case "StripAccents":
		return stripAccentsNorm{}, nil
	case "Nmt":
		return nmtNorm{}, nil
	case "ByteLevel":
		return byteLevelNorm{}, nil
	case "Strip":
		var c struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("Strip: %w", err)
		}
		return stripNorm{c.Left, c.Right}, nil
	case "Prepend":
		var c struct {
			Prepend *string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &c); err != nil || c.Prepend == nil {
			return nil, fmt.Errorf(`Prepend: want {"prepend": string}`)
		}
		return prependNorm{*c.Prepend}, nil
	case "Replace":
		re, content, err := parseReplace(raw)
		if err != nil {
			return nil, err
		}
		return replaceNorm{re, content}, nil
	case "Sequence":
		seq, err := parseSequence(raw, "normalizers", parseNormalizer)
		return normSequence(seq), err
	}
	return nil, fmt.Errorf("unsupported type %q", typ)
}

// parseReplace reads a Replace component (a normalizer or a decoder): its
// compiled pattern and the content that replaces each match.
func parseReplace(raw json.RawMessage) (*regexp2.Regexp, string, error) {
	var c struct {
		Pattern *pattern `json:"pattern"`
		Content *string  `json:"content"`
	}
	if err := json.Unmarshal(raw, &c); err != nil || c.Content == nil {
		return nil, "", fmt.Errorf(`Replace: want {"pattern": {...}, "content": string}`)
	}
	re, err := c.Pattern.compile()
	if err != nil {
		return nil, "", fmt.Errorf("Replace: %w", err)
	}
	return re, *c.Content, nil
}

// parseSequence reads a Sequence component: the list under key, each
// element parsed by parse; errors name the element's index.
func parseSequence[T any](raw json.RawMessage, key string, parse func(json.RawMessage) (T, error)) ([]T, error) {
	var c map[string]json.RawMessage
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("Sequence: %w", err)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(c[key], &items); err != nil && c[key] != nil {
		return nil, fmt.Errorf("Sequence: %s: %w", key, err)
	}
	seq := make([]T, 0, len(items))
	for i, r := range items {
		v, err := parse(r)
		if err != nil {
			return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
		}
		seq = append(seq, v)
	}
	return seq, nil
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	typ, err := componentType(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		c := struct {
			AddPrefixSpace *bool `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("ByteLevel: %w", err)
		}
		p := byteLevelPreTok{addPrefixSpace: true, useRegex: true}
		if c.AddPrefixSpace != nil {
			p.addPrefixSpace = *c.AddPrefixSpace
		}
		if c.UseRegex != nil {
			p.useRegex = *c.UseRegex
		}
		return p, nil
	case "Split":
		var c struct {
			Pattern  *pattern `json:"pattern"`
			Behavior string   `json:"behavior"`
			Invert   bool     `json:"invert"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		re, err := c.Pattern.compile()
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		return splitPreTok{re: re, b: b, invert: c.Invert}, nil
	case "Digits":
		var c struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("Digits: %w", err)
		}
		if c.Individual {
			return funcPreTok{isNumeric, isolated}, nil
		}
		return funcPreTok{isNumeric, contiguous}, nil
	case "Punctuation":
		c := struct {
			Behavior *string `json:"behavior"`
		}{}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("Punctuation: %w", err)
		}
		b := isolated
		if c.Behavior != nil {
			if b, err = parseBehavior(*c.Behavior); err != nil {
				return nil, fmt.Errorf("Punctuation: %w", err)
			}
		}
		return funcPreTok{isPunctuation, b}, nil
	case "Whitespace":
		return whitespacePreTok{}, nil
	case "WhitespaceSplit":
		return funcPreTok{isWhitespace, removed}, nil
	case "BertPreTokenizer":
		return bertPreTok{}, nil
	case "CharDelimiterSplit":
		var c struct {
			Delimiter string `json:"delimiter"`
		}
		if err := json.Unmarshal(raw, &c); err != nil || utf8.RuneCountInString(c.Delimiter) != 1 {
			return nil, errors.New(`CharDelimiterSplit: want {"delimiter": one character}`)
		}
		d, _ := utf8.DecodeRuneInString(c.Delimiter)
		return funcPreTok{func(r rune) bool { return r == d }, removed}, nil
	case "Sequence":
		seq, err := parseSequence(raw, "pretokenizers", parsePreTokenizer)
		return preTokSequence(seq), err
	}
	return nil, fmt.Errorf("unsupported type %q", typ)
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	typ, err := componentType(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		return byteLevelDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Strip":
		var c struct {
			Content *string `json:"content"`
			Start   int     `json:"start"`
			Stop    int     `json:"stop"`
		}
		if err := json.Unmarshal(raw, &c); err != nil || c.Content == nil ||
			utf8.RuneCountInString(*c.Content) != 1 || c.Start < 0 || c.Stop < 0 {
			return nil, errors.New(`Strip: want {"content": one character, "start": n, "stop": n}`)
		}
		r, _ := utf8.DecodeRuneInString(*c.Content)
		return stripDec{r, c.Start, c.Stop}, nil
	case "Replace":
		re, content, err := parseReplace(raw)
		if err != nil {
			return nil, err
		}
		return replaceDec{re, content}, nil
	case "BPEDecoder":
		c := struct {
			Suffix *string `json:"suffix"`
		}{}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("BPEDecoder: %w", err)
		}
		d := bpeDec{suffix: "</w>"}
		if c.Suffix != nil {
			d.suffix = *c.Suffix
		}
		return d, nil
	case "Sequence":
		seq, err := parseSequence(raw, "decoders", parseDecoder)
		return decSequence(seq), err
	}
	return nil, fmt.Errorf("unsupported type %q", typ)
}

// addTokens registers the added tokens as tokenizers' AddedVocabulary
// does when it loads a file: a token's id is its id in the vocabulary
// when it has one (the "id" field is only checked by a warning there),
// otherwise the next free id after the model's vocabulary.
func (t *Tokenizer) addTokens(list []addedTokenJSON) error {
	t.added = make(map[string]*addedToken)
	t.addedByID = make(map[int]*addedToken)
	t.special = make(map[string]bool)
	next := len(t.model.vocab)
	for i, a := range list {
		if a.Content == nil {
			return fmt.Errorf("added_tokens[%d]: missing content", i)
		}
		if a.ID != nil && (*a.ID < 0 || *a.ID > math.MaxInt32) {
			return fmt.Errorf("added_tokens[%d]: id %d outside [0, %d]", i, *a.ID, math.MaxInt32)
		}
		if *a.Content == "" {
			continue
		}
		tok := &addedToken{
			content:    *a.Content,
			singleWord: a.SingleWord,
			lstrip:     a.LStrip,
			rstrip:     a.RStrip,
			normalized: !a.Special,
			special:    a.Special,
		}
		if a.Normalized != nil {
			tok.normalized = *a.Normalized
		}
		if old, ok := t.added[tok.content]; ok {
			tok.id = old.id
		} else if id, ok := t.model.vocab[tok.content]; ok {
			tok.id = id
		} else {
			tok.id = next
			next++
		}
		t.added[tok.content] = tok
		t.addedByID[tok.id] = tok
		if tok.special {
			t.special[tok.content] = true
		}
	}
	// Match tables over the final entry of every id, as tokenizers builds
	// them from its id-to-token map.
	ids := make([]int, 0, len(t.addedByID))
	for id := range t.addedByID {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	var raw, normed []*addedToken
	t.decodeForm = make(map[int]string)
	for _, id := range ids {
		tok := t.addedByID[id]
		if !tok.normalized {
			raw = append(raw, tok)
			continue
		}
		form := tok.content
		if t.normalizer != nil {
			form = t.normalizer.normalize(form)
		}
		if form != tok.content {
			t.decodeForm[id] = form
		}
		normed = append(normed, &addedToken{
			content: form, id: tok.id, singleWord: tok.singleWord,
			lstrip: tok.lstrip, rstrip: tok.rstrip, normalized: true, special: tok.special,
		})
	}
	t.rawAdded = newAddedMatcher(raw)
	t.normAdded = newAddedMatcher(normed)
	return nil
}

// escapeLiteral spells s as a regex that matches exactly s.
func escapeLiteral(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case strings.ContainsRune(`\.+*?()|[]{}^$# -`, r):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7F:
			fmt.Fprintf(&b, `\x%02X`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
