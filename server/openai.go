package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// chatCompletionRequest is the body of POST /v1/chat/completions: OpenAI's
// fields this server acts on, plus the sampling extensions of
// /v1/audio/chat (top_k, repetition_penalty, text_*) and conversation_id.
// Other fields are ignored.
type chatCompletionRequest struct {
	Messages   []chatMessage `json:"messages"`
	Modalities []string      `json:"modalities"`
	Audio      *struct {
		Voice  string `json:"voice"`
		Format string `json:"format"`
	} `json:"audio"`
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int   `json:"max_tokens"`
	MaxCompletionTokens *int   `json:"max_completion_tokens"`
	N                   *int   `json:"n"`
	ConversationID      string `json:"conversation_id"`
	// Tool calling, refused: the model has none here.
	Tools        []json.RawMessage `json:"tools"`
	ToolChoice   json.RawMessage   `json:"tool_choice"`
	Functions    []json.RawMessage `json:"functions"`
	FunctionCall json.RawMessage   `json:"function_call"`
	samplingFields
}

// refuseTools turns away tool calling (an empty list of tools, and
// tool_choice "none" or "auto", ask for none and are accepted).
func (r *chatCompletionRequest) refuseTools() *apiError {
	const why = "this server has no tool calling (the model calls no functions here)"
	switch choice := strings.TrimSpace(string(r.ToolChoice)); {
	case len(r.Tools) > 0:
		return badRequest(codeUnsupportedValue, "tools", "tools: %s", why)
	case len(r.Functions) > 0:
		return badRequest(codeUnsupportedValue, "functions", "functions: %s", why)
	case choice != "" && choice != "null" && choice != `"none"` && choice != `"auto"`:
		return badRequest(codeUnsupportedValue, "tool_choice", "tool_choice %s: %s", quote(choice), why)
	case len(r.FunctionCall) > 0 && string(r.FunctionCall) != "null" && string(r.FunctionCall) != `"none"` && string(r.FunctionCall) != `"auto"`:
		return badRequest(codeUnsupportedValue, "function_call", "function_call: %s", why)
	}
	return nil
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string, an array of parts, or null
	Audio   *struct {
		ID string `json:"id"`
	} `json:"audio"`
}

type contentPart struct {
	Type       string `json:"type"`
	Text       string `json:"text"`
	InputAudio *struct {
		Data   string `json:"data"`
		Format string `json:"format"`
	} `json:"input_audio"`
}

// chatJob is a decoded chat completion request.
type chatJob struct {
	turnJob
	audioOut     bool   // modalities include "audio"
	format       string // the reply audio's format: wav or pcm16
	includeUsage bool
}

// decodeChatCompletion parses and validates a /v1/chat/completions body.
//
// The server keeps each conversation's history: a request's messages up
// to its last assistant message are not replayed. That message must carry
// the audio id of the conversation's latest reply (as OpenAI clients send
// {"role": "assistant", "audio": {"id": …}}), or the request must name
// conversation_id. The user messages after it are the new turn: their
// text parts, joined by newlines, and at most one input_audio part (WAV).
// System and developer messages set the system prompt of a new
// conversation.
func decodeChatCompletion(body []byte, lim limits, seed func() int64) (*chatJob, *apiError) {
	var r chatCompletionRequest
	if err := unmarshal(body, &r); err != nil {
		return nil, err
	}
	job := &chatJob{turnJob: turnJob{conversationID: r.ConversationID, stream: r.Stream, expectTurns: -1}}
	if len(r.Messages) == 0 {
		return nil, badRequest(codeMissingInput, "messages", "messages is empty")
	}
	if r.N != nil && *r.N != 1 {
		return nil, badRequest(codeUnsupportedValue, "n", "n %d: this server returns one choice", *r.N)
	}
	if err := r.refuseTools(); err != nil {
		return nil, err
	}
	for i, m := range r.Modalities {
		switch m {
		case "text":
		case "audio":
			job.audioOut = true
		default:
			return nil, badRequest(codeUnsupportedValue, fmt.Sprintf("modalities[%d]", i), "modality %q: want \"text\" or \"audio\"", m)
		}
	}
	if job.audioOut {
		job.format = "wav"
		if r.Stream {
			job.format = "pcm16"
		}
		if r.Audio != nil && r.Audio.Format != "" {
			job.format = r.Audio.Format
		}
		switch {
		case job.format != "wav" && job.format != "pcm16":
			return nil, badRequest(codeUnsupportedValue, "audio.format", "audio format %q: this server writes wav or pcm16", job.format)
		case r.Stream && job.format != "pcm16":
			return nil, badRequest(codeUnsupportedValue, "audio.format", "a streamed reply's audio is pcm16 (24 kHz mono); ask for \"pcm16\"")
		}
	}
	job.includeUsage = r.StreamOptions != nil && r.StreamOptions.IncludeUsage

	// The last assistant message anchors the request to a conversation.
	last := -1
	var system []string
	for i, m := range r.Messages {
		switch m.Role {
		case "system", "developer":
			texts, _, err := parseContent(m.Content, fmt.Sprintf("messages[%d]", i), lim, false)
			if err != nil {
				return nil, err
			}
			system = append(system, texts...)
		case "user":
		case "assistant":
			last = i
		case "tool", "function":
			return nil, badRequest(codeUnsupportedValue, fmt.Sprintf("messages[%d].role", i), "role %q: this model has no tool calling here", m.Role)
		default:
			return nil, badRequest(codeInvalidValue, fmt.Sprintf("messages[%d].role", i), "role %q: want system, developer, user or assistant", m.Role)
		}
	}
	job.req.System = strings.Join(system, "\n")
	if err := lim.checkText(job.req.System, "messages", "the system and developer messages' text"); err != nil {
		return nil, err
	}
	// The family's TTS voices (see turnJob.applyVoice).
	if r.Audio != nil {
		job.voice = r.Audio.Voice
	}
	if last >= 0 {
		m := r.Messages[last]
		param := fmt.Sprintf("messages[%d].audio.id", last)
		switch {
		case m.Audio != nil && m.Audio.ID != "":
			conv, n, ok := parseAudioID(m.Audio.ID)
			if !ok {
				return nil, badRequest(codeInvalidValue, param, "audio id %s was not issued by this server", quote(m.Audio.ID))
			}
			if job.conversationID != "" && job.conversationID != conv {
				return nil, badRequest(codeInvalidValue, "conversation_id", "conversation_id and %s name different conversations", param)
			}
			job.conversationID, job.expectTurns = conv, n
		case job.conversationID == "":
			return nil, badRequest(codeInvalidValue, fmt.Sprintf("messages[%d]", last),
				"this server keeps each conversation's history itself: refer to the previous reply by its audio id "+
					`({"role": "assistant", "audio": {"id": …}}) or pass conversation_id`)
		}
	}

	// The new turn: the user messages after the anchor.
	var texts []string
	users := 0
	for i := last + 1; i < len(r.Messages); i++ {
		if r.Messages[i].Role != "user" {
			continue
		}
		users++
		param := fmt.Sprintf("messages[%d]", i)
		t, clip, err := parseContent(r.Messages[i].Content, param, lim, true)
		if err != nil {
			return nil, err
		}
		texts = append(texts, t...)
		if clip != nil {
			if job.req.Audio != nil {
				return nil, badRequest(codeUnsupportedValue, param, "a turn takes one input_audio part")
			}
			job.req.Audio, job.audioParam = clip.clip, clip.param
		}
	}
	if users == 0 {
		return nil, badRequest(codeMissingInput, "messages", "no user message after the last assistant message")
	}
	job.req.Text = strings.Join(texts, "\n")
	if err := lim.checkText(job.req.Text, "messages", "the new user messages' text"); err != nil {
		return nil, err
	}
	if job.req.Audio == nil && strings.TrimSpace(job.req.Text) == "" {
		return nil, badRequest(codeMissingInput, "messages", "the user's message has neither text nor input_audio")
	}
	maxTok, param := r.MaxTokens, "max_tokens"
	if r.MaxCompletionTokens != nil {
		maxTok, param = r.MaxCompletionTokens, "max_completion_tokens"
	}
	var err *apiError
	if job.req.MaxNewTokens, err = maxNewTokens(maxTok, param, lim); err != nil {
		return nil, err
	}
	if err := r.samplingFields.apply(&job.req, seed); err != nil {
		return nil, err
	}
	return job, nil
}

// inputClip is a decoded input_audio part and the field it came from.
type inputClip struct {
	clip  *audio.Clip
	param string
}

// parseContent returns a message's text parts and its input_audio part
// (allowed when withAudio).
func parseContent(raw json.RawMessage, param string, lim limits, withAudio bool) ([]string, *inputClip, *apiError) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, nil, badRequest(codeInvalidJSON, param+".content", "content: %v", err)
		}
		return []string{s}, nil, nil
	case raw[0] != '[':
		return nil, nil, badRequest(codeInvalidJSON, param+".content", "content must be a string or an array of content parts")
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, nil, badRequest(codeInvalidJSON, param+".content", "content: %v", err)
	}
	var texts []string
	var clip *inputClip
	for j, rp := range parts {
		pp := fmt.Sprintf("%s.content[%d]", param, j)
		var p contentPart
		if err := unmarshal(rp, &p); err != nil {
			if err.Param != nil {
				*err.Param = pp + "." + *err.Param
			} else {
				err.Param = &pp
			}
			return nil, nil, err
		}
		switch p.Type {
		case "text":
			texts = append(texts, p.Text)
		case "input_audio":
			if !withAudio {
				return nil, nil, badRequest(codeUnsupportedValue, pp+".type", "input_audio belongs in a user message")
			}
			if clip != nil {
				return nil, nil, badRequest(codeUnsupportedValue, pp, "a turn takes one input_audio part")
			}
			if p.InputAudio == nil {
				return nil, nil, badRequest(codeMissingInput, pp+".input_audio", "input_audio is missing")
			}
			if f := p.InputAudio.Format; f != "" && f != "wav" {
				return nil, nil, badRequest(codeUnsupportedAudio, pp+".input_audio.format", "input audio format %q: send wav", f)
			}
			c, err := decodeAudio(p.InputAudio.Data, pp+".input_audio.data", lim)
			if err != nil {
				return nil, nil, err
			}
			clip = &inputClip{clip: c, param: pp + ".input_audio.data"}
		default:
			return nil, nil, badRequest(codeUnsupportedValue, pp+".type", "content part type %q: want text or input_audio", p.Type)
		}
	}
	return texts, clip, nil
}

// audioID names a conversation's n-th reply: audio_<conversation id>_<n>.
func audioID(conv string, n int) string { return "audio_" + conv + "_" + strconv.Itoa(n) }

func parseAudioID(id string) (conv string, n int, ok bool) {
	rest, ok := strings.CutPrefix(id, "audio_")
	i := strings.LastIndexByte(rest, '_')
	if !ok || i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(rest[i+1:])
	if err != nil || n < 1 || !strings.HasPrefix(rest[:i], "conv_") {
		return "", 0, false
	}
	return rest[:i], n, true
}

// Chat completion replies.
type (
	chatCompletion struct {
		ID             string       `json:"id"`
		Object         string       `json:"object"`
		Created        int64        `json:"created"`
		Model          string       `json:"model"`
		Choices        []ccChoice   `json:"choices"`
		Usage          *ccUsage     `json:"usage,omitempty"`
		ConversationID string       `json:"conversation_id,omitempty"` // extension
		Timings        *timingsJSON `json:"timings,omitempty"`         // extension
	}
	ccChoice struct {
		Index        int        `json:"index"`
		Message      *ccMessage `json:"message,omitempty"` // chat.completion
		Delta        *ccMessage `json:"delta,omitempty"`   // chat.completion.chunk
		FinishReason *string    `json:"finish_reason"`
		Logprobs     *struct{}  `json:"logprobs"`
	}
	ccMessage struct {
		Role    string   `json:"role,omitempty"`
		Content *string  `json:"content,omitempty"`
		Refusal *string  `json:"refusal,omitempty"`
		Audio   *ccAudio `json:"audio,omitempty"`
	}
	ccAudio struct {
		ID         string `json:"id,omitempty"`
		Data       string `json:"data,omitempty"`
		Transcript string `json:"transcript,omitempty"`
		ExpiresAt  int64  `json:"expires_at,omitempty"`
	}
	ccUsage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
		Details          struct {
			TextTokens  int `json:"text_tokens"`
			AudioTokens int `json:"audio_tokens"`
		} `json:"completion_tokens_details"`
	}
)

func usageOf(tm pipeline.Timings) *ccUsage {
	u := &ccUsage{PromptTokens: tm.PromptRows, CompletionTokens: tm.Steps, TotalTokens: tm.PromptRows + tm.Steps}
	u.Details.TextTokens, u.Details.AudioTokens = tm.Tokens, tm.Frames
	return u
}

func finishReason(r pipeline.StopReason) *string {
	s := "stop"
	if r == pipeline.MaxTokens {
		s = "length"
	}
	return &s
}

// chatCompletions serves POST /v1/chat/completions.
func (s *Server) chatCompletions(c echo.Context) error {
	be, job, t, aerr := begin(s, c, decodeChatCompletion, func(j *chatJob) *turnJob { return &j.turnJob })
	if aerr != nil {
		return aerr
	}
	head := chatCompletion{ID: newID("chatcmpl-"), Created: time.Now().Unix(), Model: be.Model, ConversationID: t.conv.id}
	id := audioID(t.conv.id, t.index)
	expires := time.Now().Add(s.cfg.ConversationTTL).Unix()
	if !job.stream {
		return s.chatCompletionJSON(c, be, t, job, head, id, expires)
	}

	st := startSSE(c, s.cfg.WriteStall, map[string]string{headerConversationID: t.conv.id})
	defer st.end()
	head.Object = "chat.completion.chunk"
	chunk := func(d *ccMessage, finish *string) error {
		ch := head
		ch.Choices = []ccChoice{{Delta: d, FinishReason: finish}}
		return st.json("", ch)
	}
	first := &ccMessage{Role: "assistant"}
	if !job.audioOut {
		first.Content = new(string)
	}
	if err := chunk(first, nil); err != nil {
		t.stream.Cancel()
	}
	head.ConversationID = "" // the first chunk carries it
	firstAudio := true
	done, fail := t.events(
		func(delta string) error {
			if job.audioOut {
				return chunk(&ccMessage{Audio: &ccAudio{ID: id, Transcript: delta}}, nil)
			}
			return chunk(&ccMessage{Content: &delta}, nil)
		},
		func(ev *pipeline.AudioEvent) error {
			if !job.audioOut {
				return nil
			}
			a := &ccAudio{ID: id, Data: base64.StdEncoding.EncodeToString(audio.PCM16LE(ev.Samples))}
			if firstAudio {
				a.ExpiresAt, firstAudio = expires, false
			}
			return chunk(&ccMessage{Audio: a}, nil)
		})
	if fail != nil {
		s.streamError(c, st, "", fail.Err)
		return nil
	}
	if chunk(&ccMessage{}, finishReason(done.Stop)) != nil {
		return nil
	}
	if job.includeUsage {
		u := head
		u.Choices, u.Usage, u.Timings = []ccChoice{}, usageOf(done.Timings), newTimings(done.Timings)
		st.json("", u)
	}
	st.event("", []byte("[DONE]"))
	return nil
}

// chatCompletionJSON collects the turn into one chat.completion object.
func (s *Server) chatCompletionJSON(c echo.Context, be *Backend, t *turn, job *chatJob, head chatCompletion, id string, expires int64) error {
	var pcm []float32
	rate := be.Engine.Model().AudioCodec().SampleRate()
	done, fail := t.events(
		func(string) error { return nil },
		func(ev *pipeline.AudioEvent) error {
			if job.audioOut {
				pcm, rate = append(pcm, ev.Samples...), ev.Rate
			}
			return nil
		})
	if fail != nil {
		return eventError(fail.Err)
	}
	msg := &ccMessage{Role: "assistant"}
	if job.audioOut {
		var data []byte
		if job.format == "wav" {
			var b bytes.Buffer
			if err := audio.WriteWAV(&b, rate, pcm); err != nil {
				return err
			}
			data = b.Bytes()
		} else {
			data = audio.PCM16LE(pcm)
		}
		msg.Audio = &ccAudio{ID: id, Data: base64.StdEncoding.EncodeToString(data), Transcript: done.Text, ExpiresAt: expires}
	} else {
		msg.Content = &done.Text
	}
	head.Object = "chat.completion"
	head.Choices = []ccChoice{{Message: msg, FinishReason: finishReason(done.Stop)}}
	head.Usage, head.Timings = usageOf(done.Timings), newTimings(done.Timings)
	data, err := marshal(head)
	if err != nil {
		return err
	}
	c.Response().Header().Set(headerConversationID, t.conv.id)
	return s.writeReply(c, data)
}
