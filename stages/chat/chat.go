// Package chat assembles a conversation into the backbone's input rows,
// framed by the model family's template (family.Template; for LFM2-Audio
// exactly as liquid-audio's ChatState does): one row per position, each with
// a modality flag — a text token (embedded with embed_tokens), an audio-in
// row (one per 80 ms encoder frame of a user clip) or an audio-out frame
// (the sum of its codebook embeddings). Text is tokenized per call, without
// special-token insertion, so BPE boundaries fall where the reference's do.
//
// A Chat only records the rows; the engine turns them into embeddings and
// remembers how many it has already fed to a session's cache, so a new turn
// prefills only what is new.
package chat

import (
	"fmt"
	"slices"
	"strings"

	"github.com/omni-pipe/omni-pipe/stages/family"
)

// Modality is a row's kind, numbered as liquid-audio's LFMModality.
type Modality uint8

// Modalities.
const (
	Text     Modality = 1
	AudioIn  Modality = 2
	AudioOut Modality = 3
)

func (m Modality) String() string {
	switch m {
	case Text:
		return "text"
	case AudioIn:
		return "audio-in"
	case AudioOut:
		return "audio-out"
	}
	return fmt.Sprintf("Modality(%d)", uint8(m))
}

// Encoder tokenizes text without adding special tokens (HF
// encode(text, add_special_tokens=False)).
type Encoder interface {
	Encode(text string) []int
}

// Clip is one user audio clip: its log-mel frames become Rows encoder rows.
// Features is the model's private payload (e.g. the mel or the encoder
// output); chat never looks at it.
type Clip struct {
	MelFrames int
	Features  any
}

// Rows returns the number of encoder rows of a clip of n mel frames:
// ceil(n/8) (liquid-audio's mel2emb_len).
func Rows(melFrames int) int { return (melFrames + 7) / 8 }

// Row is one input position.
type Row struct {
	Mod   Modality
	Token int   // Text
	Clip  *Clip // AudioIn
	Index int   // AudioIn: the row within the clip
	Codes []int // AudioOut: one code per codebook
}

// Role of a turn (family.Role).
type Role = family.Role

// Roles.
const (
	System    = family.System
	User      = family.User
	Assistant = family.Assistant
)

// Chat is a conversation's rows.
type Chat struct {
	enc   Encoder
	tmpl  family.Template
	rows  []Row
	begin int // the rows of the template's Begin
}

// New starts a conversation framed by the family's template: with its
// Begin text (LFM2: <|startoftext|>).
func New(enc Encoder, tmpl family.Template) *Chat {
	c := &Chat{enc: enc, tmpl: tmpl}
	c.AddText(tmpl.Begin())
	c.begin = len(c.rows)
	return c
}

// Empty reports whether the conversation holds only its opening (the
// template's Begin).
func (c *Chat) Empty() bool { return len(c.rows) == c.begin }

// AddText appends the tokens of text.
func (c *Chat) AddText(text string) {
	for _, id := range c.enc.Encode(text) {
		c.rows = append(c.rows, Row{Mod: Text, Token: id})
	}
}

// NewTurn appends the template's opening of a role's turn (ChatML:
// "<|im_start|>{role}\n").
func (c *Chat) NewTurn(role Role) { c.AddText(c.tmpl.TurnStart(role)) }

// EndTurn appends the template's end of a turn (ChatML: "<|im_end|>\n").
func (c *Chat) EndTurn() { c.AddText(c.tmpl.TurnEnd()) }

// AddAudio appends a user clip's encoder rows.
func (c *Chat) AddAudio(clip *Clip) {
	for i := 0; i < Rows(clip.MelFrames); i++ {
		c.rows = append(c.rows, Row{Mod: AudioIn, Clip: clip, Index: i})
	}
}

// AppendToken appends a generated text token (chat.append of text).
func (c *Chat) AppendToken(id int) { c.rows = append(c.rows, Row{Mod: Text, Token: id}) }

// AppendFrame appends a generated audio frame (chat.append of audio_out).
func (c *Chat) AppendFrame(codes []int) {
	c.rows = append(c.rows, Row{Mod: AudioOut, Codes: append([]int(nil), codes...)})
}

// Clone returns a copy of the conversation that grows independently (its
// rows' clips and codes are shared: neither copy modifies them).
func (c *Chat) Clone() *Chat {
	return &Chat{enc: c.enc, tmpl: c.tmpl, rows: slices.Clone(c.rows), begin: c.begin}
}

// Len returns the number of rows.
func (c *Chat) Len() int { return len(c.rows) }

// Rows returns rows [from, to).
func (c *Chat) Rows(from, to int) []Row { return c.rows[from:to] }

// Truncate drops every row from n on (to undo a turn that failed).
func (c *Chat) Truncate(n int) { c.rows = c.rows[:n] }

// TextIDs returns every text token in order (ChatState.text).
func (c *Chat) TextIDs() []int {
	var ids []int
	for _, r := range c.rows {
		if r.Mod == Text {
			ids = append(ids, r.Token)
		}
	}
	return ids
}

// Modalities returns every row's flag (ChatState.modality_flag).
func (c *Chat) Modalities() []Modality {
	out := make([]Modality, len(c.rows))
	for i, r := range c.rows {
		out[i] = r.Mod
	}
	return out
}

// AudioOut returns the audio-out frames in order (ChatState.audio_out,
// frame-major).
func (c *Chat) AudioOut() [][]int {
	var out [][]int
	for _, r := range c.rows {
		if r.Mod == AudioOut {
			out = append(out, r.Codes)
		}
	}
	return out
}

// String summarises the rows, e.g. "T×21 A×62 T×10".
func (c *Chat) String() string {
	var b strings.Builder
	for i := 0; i < len(c.rows); {
		j := i
		for j < len(c.rows) && c.rows[j].Mod == c.rows[i].Mod {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%c×%d", "?TAO"[c.rows[i].Mod], j-i)
		i = j
	}
	return b.String()
}
