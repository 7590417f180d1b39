package family

import (
	"fmt"
	"strings"
)

// Role of a conversation turn.
type Role string

// Roles.
const (
	System    Role = "system"
	User      Role = "user"
	Assistant Role = "assistant"
)

// Mode is how a turn alternates text and audio; a family's default system
// prompt depends on it.
type Mode uint8

// Modes.
const (
	// Interleaved is speech to speech: text and audio alternate.
	Interleaved Mode = iota + 1
	// Sequential is ASR and TTS: text, then audio, then text.
	Sequential
)

func (m Mode) String() string {
	switch m {
	case Interleaved:
		return "interleaved"
	case Sequential:
		return "sequential"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Template is how a family frames a conversation as text and what it
// prompts by default: the turns' control text (tokenized with special
// tokens recognized), the system prompt of each mode, the text-to-speech
// voices. The tokens that end a turn or start audio are in Info.Special.
type Template interface {
	// Begin is the text a conversation opens with (LFM2: "<|startoftext|>").
	Begin() string
	// TurnStart opens a turn of role (ChatML: "<|im_start|>user\n").
	TurnStart(role Role) string
	// TurnEnd closes a turn (ChatML: "<|im_end|>\n").
	TurnEnd() string
	// SystemPrompt is the system prompt of a new conversation in mode when
	// the request gives none ("" for none).
	SystemPrompt(mode Mode) string
	// Voices are the family's text-to-speech voices, each run as a
	// sequential turn with its system prompt; nil when the family has no
	// preset voices.
	Voices() []Voice
}

// Voice is a text-to-speech voice: its name (as a client passes it, e.g.
// "us_male") and the system prompt that selects it.
type Voice struct {
	Name   string `json:"name"`
	Prompt string `json:"prompt"`
}

// VoicePrompt returns the system prompt of t's voice named voice; case,
// hyphens and spaces do not matter ("US male", "uk-female").
func VoicePrompt(t Template, voice string) (string, bool) {
	v := strings.ToLower(strings.NewReplacer("-", "_", " ", "_").Replace(strings.TrimSpace(voice)))
	for _, tv := range t.Voices() {
		if tv.Name == v {
			return tv.Prompt, true
		}
	}
	return "", false
}

// VoiceNames returns the names of t's voices, in order.
func VoiceNames(t Template) []string {
	vs := t.Voices()
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.Name
	}
	return names
}

// Defaults is what a template chooses when a request does not: the system
// prompt of each mode and the voices (for /health, /v1/models and the
// bench report).
type Defaults struct {
	SystemPrompts map[string]string `json:"system_prompts,omitempty"` // by mode name
	Voices        []Voice           `json:"voices,omitempty"`
}

// DefaultsOf returns t's defaults.
func DefaultsOf(t Template) Defaults {
	d := Defaults{Voices: t.Voices()}
	for _, m := range []Mode{Interleaved, Sequential} {
		if p := t.SystemPrompt(m); p != "" {
			if d.SystemPrompts == nil {
				d.SystemPrompts = map[string]string{}
			}
			d.SystemPrompts[m.String()] = p
		}
	}
	return d
}

// ChatML is the ChatML framing ("<|im_start|>{role}\n{content}<|im_end|>\n")
// after a beginning-of-text token, with a family's prompts: the template
// of the LFM2 families (their ChatState builds it by hand).
type ChatML struct {
	// BOS is the text the conversation opens with.
	BOS string
	// Prompts are the default system prompts by mode.
	Prompts map[Mode]string
	// TTS lists the text-to-speech voices.
	TTS []Voice
}

var _ Template = ChatML{}

// Begin implements Template.
func (c ChatML) Begin() string { return c.BOS }

// TurnStart implements Template.
func (ChatML) TurnStart(role Role) string { return "<|im_start|>" + string(role) + "\n" }

// TurnEnd implements Template.
func (ChatML) TurnEnd() string { return "<|im_end|>\n" }

// SystemPrompt implements Template.
func (c ChatML) SystemPrompt(mode Mode) string { return c.Prompts[mode] }

// Voices implements Template.
func (c ChatML) Voices() []Voice { return c.TTS }
