package tokenizer

import "strings"

// streamMode is how a StreamDecoder can cut the decoder's output.
type streamMode uint8

const (
	// streamBytes: the decoder is ByteLevel alone, so decoding is "bytes
	// of every token, then lossy UTF-8"; text is emitted up to the last
	// complete character.
	streamBytes streamMode = iota
	// streamText: any other chain whose output only grows at the end as
	// ids are appended; the text of all ids is decoded again on each Add,
	// holding back trailing U+FFFD (a character that may still complete)
	// and the text of a trailing run of byte-fallback tokens.
	streamText
	// streamAtFlush: a chain that may rewrite the end of the text (Strip
	// with stop > 0); nothing is emitted before Flush.
	streamAtFlush
)

// streamKind classifies a decoder chain.
func streamKind(d decoder) streamMode {
	switch d := d.(type) {
	case byteLevelDec:
		return streamBytes
	case decSequence:
		if len(d) == 1 {
			return streamKind(d[0])
		}
	}
	if anyDecoder(d, func(d decoder) bool { s, ok := d.(stripDec); return ok && s.stop > 0 }) {
		return streamAtFlush
	}
	return streamText
}

// anyDecoder reports whether f holds for d or any decoder in it.
func anyDecoder(d decoder, f func(decoder) bool) bool {
	if seq, ok := d.(decSequence); ok {
		for _, x := range seq {
			if anyDecoder(x, f) {
				return true
			}
		}
		return false
	}
	return d != nil && f(d)
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
	if anyDecoder(d.t.decoder, isByteFallback) {
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

func isByteFallback(d decoder) bool { _, ok := d.(byteFallbackDec); return ok }

func (d *StreamDecoder) isFallbackByte(id int) bool {
	tok, ok := d.t.token(id)
	if !ok {
		return false
	}
	_, ok = fallbackByte(tok)
	return ok
}
