package tokenizer

import "unicode/utf8"

// This file reproduces Rust's String::from_utf8_lossy, which the byte-level
// decoder of Hugging Face tokenizers uses: every maximal subpart of an
// ill-formed sequence becomes one U+FFFD (Unicode §3.9, "substitution of
// maximal subparts"). Go's utf8.DecodeRune instead reports one error per
// byte, so "\xE2\x82" is one U+FFFD here and two in a Go range loop.

// nextChunk scans the UTF-8 sequence at the start of b. It returns its
// length n, whether it is a valid character, and whether it is incomplete:
// b ends inside a sequence that more bytes could still complete (then n is
// len(b) and valid is false). b must not be empty.
func nextChunk(b []byte) (n int, valid, incomplete bool) {
	c := b[0]
	if c < utf8.RuneSelf {
		return 1, true, false
	}
	// lo, hi bound the second byte; width is the sequence length.
	var lo, hi byte = 0x80, 0xBF
	width := 0
	switch {
	case c >= 0xC2 && c <= 0xDF:
		width = 2
	case c == 0xE0:
		width, lo = 3, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		width = 3
	case c == 0xED:
		width, hi = 3, 0x9F
	case c == 0xF0:
		width, lo = 4, 0x90
	case c >= 0xF1 && c <= 0xF3:
		width = 4
	case c == 0xF4:
		width, hi = 4, 0x8F
	default:
		return 1, false, false
	}
	for i := 1; i < width; i++ {
		if i >= len(b) {
			return len(b), false, true
		}
		x := b[i]
		if i == 1 && (x < lo || x > hi) || i > 1 && (x < 0x80 || x > 0xBF) {
			return i, false, false
		}
	}
	return width, true, false
}

// appendLossy appends b to dst as text, replacing each maximal ill-formed
// subpart (including an incomplete sequence at the end) with U+FFFD.
func appendLossy(dst []byte, b []byte) []byte {
	for len(b) > 0 {
		n, valid, _ := nextChunk(b)
		if valid {
			dst = append(dst, b[:n]...)
		} else {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		}
		b = b[n:]
	}
	return dst
}

// lossyString is appendLossy for a whole string; valid UTF-8 is returned
// as is, without copying.
func lossyString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(appendLossy(make([]byte, 0, len(s)+8), []byte(s)))
}

// settled returns the length of the longest prefix of b whose lossy
// decoding can no longer change whatever bytes follow: everything except a
// trailing sequence that is incomplete but could still become valid.
func settled(b []byte) int {
	i := 0
	for i < len(b) {
		n, _, incomplete := nextChunk(b[i:])
		if incomplete {
			return i
		}
		i += n
	}
	return i
}
