package realtime

import (
	"maps"
	"slices"
)

// Dialect is the version of the wire format a client speaks.
type Dialect uint8

// Dialects.
const (
	// GA is the generally available format (the official SDKs' current
	// one): response.output_audio.delta, conversation.item.added/done,
	// session.audio.input.turn_detection.
	GA Dialect = iota
	// Beta is the format of clients that send "OpenAI-Beta: realtime=v1":
	// response.audio.delta, conversation.item.created, flat session fields.
	Beta
)

func (d Dialect) String() string {
	if d == Beta {
		return "beta"
	}
	return "ga"
}

// betaNames maps the GA server events that the beta format names
// differently ("" for those it does not send).
var betaNames = map[string]string{
	"response.output_audio.delta":            "response.audio.delta",
	"response.output_audio.done":             "response.audio.done",
	"response.output_audio_transcript.delta": "response.audio_transcript.delta",
	"response.output_audio_transcript.done":  "response.audio_transcript.done",
	"response.output_text.delta":             "response.text.delta",
	"response.output_text.done":              "response.text.done",
	"conversation.item.added":                "conversation.item.created",
	"conversation.item.done":                 "",
}

// Name returns d's name of the server event GA calls ga, or "" when d does
// not send that event.
func (d Dialect) Name(ga string) string {
	if d == Beta {
		if b, ok := betaNames[ga]; ok {
			return b
		}
	}
	return ga
}

// AssistantContentType is the type of an assistant item's audio part.
func (d Dialect) AssistantContentType() string {
	if d == Beta {
		return "audio"
	}
	return "output_audio"
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
