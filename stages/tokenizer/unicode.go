package tokenizer

import "unicode"

// Character classes as the Rust side of Hugging Face tokenizers defines
// them. Go's unicode tables may be of a different Unicode version than the
// Rust crates; that only matters for recently assigned characters.

// isWordChar is Rust regex's Unicode \w: Alphabetic, marks, decimal
// numbers, connector punctuation and the join controls.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) ||
		unicode.Is(unicode.Other_Alphabetic, r) || unicode.IsMark(r) ||
		unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) ||
		r == '\u200C' || r == '\u200D'
}

// isWhitespace is Rust's char::is_whitespace and regex \s (White_Space).
func isWhitespace(r rune) bool { return unicode.IsSpace(r) }

// isNumeric is Rust's char::is_numeric (general categories Nd, Nl, No).
func isNumeric(r rune) bool { return unicode.IsNumber(r) }

// isPunctuation is the Punctuation and BertPreTokenizer test: ASCII
// punctuation (which includes symbols such as '$' and '+') or any Unicode
// punctuation category.
func isPunctuation(r rune) bool {
	if r < 0x80 {
		return r >= '!' && r <= '/' || r >= ':' && r <= '@' ||
			r >= '[' && r <= '`' || r >= '{' && r <= '~'
	}
	return unicode.IsPunct(r)
}

// byteToRune is GPT-2's byte-to-unicode table: printable Latin-1 bytes map
// to themselves, the others to U+0100 onwards in byte order.
var byteToRune, runeToByte = byteTables()

func byteTables() ([256]rune, map[rune]byte) {
	var fwd [256]rune
	rev := make(map[rune]byte, 256)
	n := rune(0)
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			fwd[b] = rune(b)
		} else {
			fwd[b] = 256 + n
			n++
		}
		rev[fwd[b]] = byte(b)
	}
	return fwd, rev
}
