package tokenizer

import "strings"

// streamMode is how a StreamDecoder can cut the decoder's output.
type streamMode uint8

const (
	// streamBytes: the decoder is ByteLevel alone, so decoding is "bytes
	// of every token, then lossy UTF-8"; text is emitted up to the last
	// complete character.
	streamBytes streamMode = iota
	// streamText: a chain whose text only grows at the end as ids are
	// appended. The text of all ids is decoded again on each Add, holding
	// back trailing U+FFFD (a character that may still complete) and the
	// text of a trailing run of byte-fallback tokens (a run decodes as a
	// whole).
	streamText
	// streamAtFlush: a chain that may rewrite text already decoded when
	// ids are appended (BPEDecoder, whose last token differs, or Replace
	// or Strip with stop > 0 after the tokens were fused into one); all
	// text is returned by Flush.
	streamAtFlush
)

// streamKind classifies a decoder chain.
func streamKind(d decoder) streamMode {
	chain := flatten(nil, d)
	if len(chain) == 1 {
		if _, ok := chain[0].(byteLevelDec); ok {
			return streamBytes
		}
	}
	fused := false // the tokens have become one string
	for _, d := range chain {
		switch d := d.(type) {
		case byteLevelDec, fuseDec:
			fused = true
		case bpeDec:
			return streamAtFlush
		case replaceDec:
			if fused {
				return streamAtFlush
			}
		case stripDec:
			if fused && d.stop > 0 {
				return streamAtFlush
			}
		}
	}
	return streamText
}

// flatten appends the decoders of d, sequences expanded, to dst.
func flatten(dst []decoder, d decoder) []decoder {
	if seq, ok := d.(decSequence); ok {
		for _, x := range seq {
			dst = flatten(dst, x)
		}
		return dst
	}
	if d != nil {
		dst = append(dst, d)
	}
	return dst
}

// StreamDecoder turns ids into text one id at a time, for streaming
// generated text. The concatenation of everything Add and Flush return
// equals Decode of all the ids, and no returned string ends inside a
// UTF-8 character: bytes of an incomplete character are held back until
// it completes (or until Flush, where they become U+FFFD as in Decode).
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	t *Tokenizer

	pending []byte // streamBytes: bytes not yet emitted

	ids     []int  // other modes: every id since the last Flush
	emitted string // other modes: the text returned so far
}

// NewStreamDecoder returns a StreamDecoder for t.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t}
}

// Add appends id and returns the text that became final (often "").
func (d *StreamDecoder) Add(id int) string {
	switch d.t.stream {
	case streamBytes:
		tok, ok := d.t.token(id)
		if !ok {
			return ""
		}
		d.pending = appendTokenBytes(d.pending, tok)
		n := settled(d.pending)
		if n == 0 {
			return ""
		}
		out := string(appendLossy(nil, d.pending[:n]))
		d.pending = append(d.pending[:0], d.pending[n:]...)
		return out
	case streamAtFlush:
		d.ids = append(d.ids, id)
		return ""
	}
	d.ids = append(d.ids, id)
	k := len(d.ids)
	if d.t.byteFallbackDec {
		for k > 0 && d.isFallbackByte(d.ids[k-1]) {
			k--
		}
	}
	s := strings.TrimRight(d.t.Decode(d.ids[:k]), "\uFFFD")
	if len(s) <= len(d.emitted) || !strings.HasPrefix(s, d.emitted) {
		return ""
	}
	out := s[len(d.emitted):]
	d.emitted = s
	return out
}

// Flush returns the text not yet returned, with U+FFFD for bytes that
// never formed a character, and resets d for a new sequence.
func (d *StreamDecoder) Flush() string {
	var out string
	if d.t.stream == streamBytes {
		out = string(appendLossy(nil, d.pending))
	} else if s := d.t.Decode(d.ids); strings.HasPrefix(s, d.emitted) {
		out = s[len(d.emitted):]
	}
	d.pending, d.ids, d.emitted = d.pending[:0], d.ids[:0], ""
	return out
}

func (d *StreamDecoder) isFallbackByte(id int) bool {
	tok, ok := d.t.token(id)
	if !ok {
		return false
	}
	_, ok = fallbackByte(tok)
	return ok
}
