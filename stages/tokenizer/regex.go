package tokenizer

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// Hugging Face tokenizers (as built for Python) compile Split and Replace
// patterns with Oniguruma in its default syntax: Ruby-style options ("m"
// makes '.' match '\n'), '^' and '$' as line anchors, Unicode-aware \s \d
// \w and possessive quantifiers. regexp2 follows .NET syntax, which agrees
// on what tokenizer files use (Unicode classes, lookaround, atomic groups,
// (?i:...)) except for a few spellings that translateRegex rewrites:
//
//   - possessive quantifiers X*+ X++ X?+ X{n,m}+ become atomic groups (?>X*);
//   - \x{HHHH} becomes a \uHHHH escape or the literal character;
//   - \h and \H (hex digit) become explicit classes;
//   - \p{^Name} becomes \P{Name};
//   - the inline option m becomes s.
//
// Oniguruma's \w is letters, marks, numbers and connector punctuation;
// regexp2's lacks some of those, so \w, \W, \b and \B are rebuilt on an
// explicit class (wordClass).
//
// Nested character classes ([a[bc]]), POSIX bracket expressions
// ([[:alpha:]]) and class set operations (&&) are refused with an error
// rather than silently read differently, and so is whatever regexp2
// cannot compile (\K, \R, absent groups, ...).
//
// Case-insensitive groups compare simple lower-case forms in regexp2 and
// case-fold in Oniguruma; the conformance texts ('ſ, 'S, the Kelvin sign
// under (?i:'s|...)) match alike.

// regexOptions make regexp2's '^' and '$' line anchors, as in Oniguruma.
const regexOptions = regexp2.Multiline

// compileRegex translates an Oniguruma pattern and compiles it.
func compileRegex(pattern string) (*regexp2.Regexp, error) {
	tr, err := translateRegex(pattern)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pattern, err)
	}
	re, err := regexp2.Compile(tr, regexOptions)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pattern, err)
	}
	return re, nil
}

// translateRegex rewrites the Oniguruma-only spellings listed above.
func translateRegex(p string) (string, error) {
	if !utf8.ValidString(p) {
		return "", fmt.Errorf("pattern is not valid UTF-8")
	}
	rs := []rune(p)
	var out []rune
	var groups []int // start in out of each open group
	atom := -1       // start in out of the last complete atom, or -1
	classStart := -1 // start in out of the open character class, or -1
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		start := len(out)
		switch {
		case c == '\\':
			if i+1 >= len(rs) {
				return "", fmt.Errorf("trailing backslash")
			}
			esc, n, err := translateEscape(rs[i+1:], classStart >= 0)
			if err != nil {
				return "", err
			}
			out = append(out, esc...)
			i += n
			if classStart < 0 {
				atom = start
			}
		case classStart >= 0:
			switch {
			case c == '[' && i+1 < len(rs) && rs[i+1] == ':' && strings.Contains(string(rs[i+2:]), ":]"):
				return "", fmt.Errorf("POSIX bracket expression at %q is not supported", string(rs[i:]))
			case c == '[':
				// Oniguruma nests classes; .NET reads '[' as a literal.
				return "", fmt.Errorf("nested character class at %q is not supported", string(rs[i:]))
			case c == '&' && i+1 < len(rs) && rs[i+1] == '&':
				return "", fmt.Errorf("character class set operation && is not supported")
			case c == ']':
				atom, classStart = classStart, -1
			}
			out = append(out, c)
		case c == '[':
			classStart = start
			out = append(out, c)
			if i+1 < len(rs) && rs[i+1] == '^' {
				out = append(out, '^')
				i++
			}
			// A ']' first in a class is a literal in Oniguruma.
			if i+1 < len(rs) && rs[i+1] == ']' {
				out = append(out, '\\', ']')
				i++
			}
		case c == '(':
			groups = append(groups, start)
			atom = -1
			out = append(out, c)
			if i+1 < len(rs) && rs[i+1] == '?' {
				// Inline options: Oniguruma's m is .NET's s.
				j := i + 2
				for j < len(rs) && strings.ContainsRune("imx-", rs[j]) {
					j++
				}
				if j > i+2 && j < len(rs) && (rs[j] == ':' || rs[j] == ')') {
					out = append(out, '?')
					for _, o := range rs[i+2 : j] {
						if o == 'm' {
							o = 's'
						}
						out = append(out, o)
					}
					i = j - 1
				}
			}
		case c == ')':
			out = append(out, c)
			if len(groups) > 0 {
				atom = groups[len(groups)-1]
				groups = groups[:len(groups)-1]
			}
		case c == '*' || c == '+' || c == '?' || c == '{' && intervalLen(rs[i:]) > 0:
			n := 1
			if c == '{' {
				n = intervalLen(rs[i:])
			}
			q := append([]rune(nil), rs[i:i+n]...)
			i += n - 1
			interval := c == '{'
			if interval && q[1] == ',' {
				// {,m} is {0,m} in Oniguruma and a literal in .NET.
				q = append([]rune("{0"), q[1:]...)
			}
			var next rune
			if i+1 < len(rs) {
				next = rs[i+1]
			}
			switch {
			case next == '+' && atom >= 0 && !interval:
				// Possessive: (?>atom quantifier).
				out = wrapAtom(out, atom, "(?>", string(q)+")")
				i++
			case next == '+' && atom >= 0:
				// An interval cannot be possessive in Oniguruma's syntax:
				// X{n,m}+ repeats the interval greedily.
				out = wrapAtom(out, atom, "(?:", string(q)+")+")
				i++
			case next == '?' && atom >= 0 && interval && !strings.ContainsRune(string(q), ','):
				// A fixed interval is greedy only: X{n}? is (?:X{n})?.
				out = wrapAtom(out, atom, "(?:", string(q)+")?")
				i++
			case next == '?':
				out = append(append(out, q...), '?')
				i++
			default:
				out = append(out, q...)
			}
			atom = -1
		case c == '|':
			atom = -1
			out = append(out, c)
		default:
			atom = start
			out = append(out, c)
		}
	}
	if classStart >= 0 {
		return "", fmt.Errorf("unterminated character class")
	}
	return string(out), nil
}

// wrapAtom encloses out[atom:] in open ... closing.
func wrapAtom(out []rune, atom int, open, closing string) []rune {
	w := append([]rune(open), out[atom:]...)
	w = append(w, []rune(closing)...)
	return append(out[:atom], w...)
}

// intervalLen returns the length of an interval quantifier {n}, {n,},
// {,m} or {n,m} at the start of rs, or 0 if rs does not start with one (a
// '{' that is not a quantifier is a literal in both engines).
func intervalLen(rs []rune) int {
	digits, comma := 0, false
	for i := 1; i < len(rs); i++ {
		switch c := rs[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == ',' && !comma:
			comma = true
		case c == '}' && digits > 0:
			return i + 1
		default:
			return 0
		}
	}
	return 0
}

// translateEscape translates the escape whose text (after the backslash)
// starts rs. It returns the replacement (backslash included) and how many
// runes of rs it used.
func translateEscape(rs []rune, inClass bool) ([]rune, int, error) {
	switch rs[0] {
	case 'x':
		if len(rs) > 1 && rs[1] == '{' {
			end := -1
			for j := 2; j < len(rs); j++ {
				if rs[j] == '}' {
					end = j
					break
				}
			}
			if end < 0 {
				return nil, 0, fmt.Errorf("unterminated \\x{...}")
			}
			v, err := strconv.ParseUint(string(rs[2:end]), 16, 32)
			if err != nil || v > utf8.MaxRune || v >= 0xD800 && v <= 0xDFFF {
				return nil, 0, fmt.Errorf("bad code point \\x{%s}", string(rs[2:end]))
			}
			return codePointEscape(rune(v)), end + 1, nil
		}
	case 'w', 'W':
		switch {
		case !inClass && rs[0] == 'w':
			return []rune("[" + wordClass + "]"), 1, nil
		case !inClass:
			return []rune("[^" + wordClass + "]"), 1, nil
		case rs[0] == 'w':
			return []rune(wordClass), 1, nil
		default:
			return nil, 0, fmt.Errorf("\\W inside a character class is not supported")
		}
	case 'b', 'B':
		if inClass {
			break // backspace in a class, as in .NET
		}
		w := "[" + wordClass + "]"
		if rs[0] == 'b' {
			return []rune("(?:(?<=" + w + ")(?!" + w + ")|(?<!" + w + ")(?=" + w + "))"), 1, nil
		}
		return []rune("(?:(?<=" + w + ")(?=" + w + ")|(?<!" + w + ")(?!" + w + "))"), 1, nil
	case 'h', 'H':
		cls := "0-9a-fA-F"
		switch {
		case inClass && rs[0] == 'h':
			return []rune(cls), 1, nil
		case inClass:
			return nil, 0, fmt.Errorf("\\H inside a character class is not supported")
		case rs[0] == 'h':
			return []rune("[" + cls + "]"), 1, nil
		default:
			return []rune("[^" + cls + "]"), 1, nil
		}
	case 'p', 'P':
		if end := closing(rs, 1, '{', '}'); end > 0 {
			if rs[2] == '^' {
				// \p{^Name} is \P{Name} and \P{^Name} is \p{Name}.
				neg := 'P'
				if rs[0] == 'P' {
					neg = 'p'
				}
				return append([]rune{'\\', neg, '{'}, rs[3:end+1]...), end + 1, nil
			}
			return append([]rune{'\\'}, rs[:end+1]...), end + 1, nil
		}
	case 'k':
		if end := closing(rs, 1, '<', '>'); end > 0 {
			return append([]rune{'\\'}, rs[:end+1]...), end + 1, nil
		}
		if end := closing(rs, 1, '\'', '\''); end > 0 {
			return append([]rune{'\\'}, rs[:end+1]...), end + 1, nil
		}
	}
	// Fixed-length escapes: \xHH, \uHHHH, \cX, and back references \N.
	n := 1
	switch c := rs[0]; {
	case c == 'x':
		n += countHex(rs[1:], 2)
	case c == 'u':
		n += countHex(rs[1:], 4)
	case c == 'c' && len(rs) > 1:
		n = 2
	case c >= '0' && c <= '9':
		for n < len(rs) && rs[n] >= '0' && rs[n] <= '9' {
			n++
		}
	}
	return append([]rune{'\\'}, rs[:n]...), n, nil
}

// closing returns the index of the close rune that ends a bracketed
// argument opened at rs[at], or -1.
func closing(rs []rune, at int, open, close rune) int {
	if at >= len(rs) || rs[at] != open {
		return -1
	}
	for j := at + 1; j < len(rs); j++ {
		if rs[j] == close {
			return j
		}
	}
	return -1
}

// countHex counts the hex digits, at most max, at the start of rs.
func countHex(rs []rune, max int) int {
	n := 0
	for n < max && n < len(rs) && strings.ContainsRune("0123456789abcdefABCDEF", rs[n]) {
		n++
	}
	return n
}

// wordClass is Oniguruma's Unicode \w, as the contents of a character
// class: letters, marks, numbers (all of N, so '²' and 'Ⅻ' are word
// characters) and connector punctuation. regexp2's own \w lacks Mc, Me,
// Nl and No; \b and \B are rebuilt on this class for the same reason.
const wordClass = `\p{L}\p{M}\p{N}\p{Pc}`

// codePointEscape spells code point r in .NET syntax.
func codePointEscape(r rune) []rune {
	switch {
	case r <= 0xFF:
		return []rune(fmt.Sprintf(`\x%02X`, r))
	case r <= 0xFFFF:
		return []rune(fmt.Sprintf(`\u%04X`, r))
	default:
		// Above the BMP regexp2 has no escape; a literal astral character
		// is never a metacharacter.
		return []rune{r}
	}
}
