package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// limits bound what a request may ask for.
type limits struct {
	maxAudio     time.Duration // the longest input clip
	maxNewTokens int           // the largest max_new_tokens
	maxTextBytes int           // the longest text, and system prompt, in bytes
}

// checkText refuses text longer than the limit, before it is tokenized.
func (lim limits) checkText(text, param, what string) *apiError {
	if len(text) > lim.maxTextBytes {
		return badRequest(codeTextTooLong, param, "%s is %d bytes; this server takes at most %d bytes", what, len(text), lim.maxTextBytes)
	}
	return nil
}

// turnJob is a decoded request: one turn to run.
type turnJob struct {
	conversationID string
	stream         bool
	req            pipeline.Request
	audioParam     string // the request's audio field, for errors found later
	// expectTurns, when not -1, is the number of replies the conversation
	// must have had: the request continues from that reply.
	expectTurns int
	// voice is the request's TTS voice name, mapped by applyVoice with the
	// served family's template.
	voice string
}

// applyVoice makes the turn text-to-speech in j.voice when it names one of
// tmpl's voices (LFM2.5-Audio's us_male, us_female, uk_male, uk_female):
// the voice's system prompt, unless the request gives one, and sequential
// generation. Other voices (OpenAI's "alloy"…) are ignored.
func (j *turnJob) applyVoice(tmpl family.Template) {
	if j.voice == "" {
		return
	}
	if p, ok := family.VoicePrompt(tmpl, j.voice); ok {
		if j.req.System == "" {
			j.req.System = p
		}
		j.req.Mode = pipeline.Sequential
	}
}

// samplingFields are the sampling parameters both routes take. The plain
// names set the audio codes' sampling (the model's speech); the text_
// names set the text's, which is greedy unless they are given.
type samplingFields struct {
	Temperature           *float64 `json:"temperature"`
	TopK                  *int     `json:"top_k"`
	TopP                  *float64 `json:"top_p"`
	RepetitionPenalty     *float64 `json:"repetition_penalty"`
	TextTemperature       *float64 `json:"text_temperature"`
	TextTopK              *int     `json:"text_top_k"`
	TextTopP              *float64 `json:"text_top_p"`
	TextRepetitionPenalty *float64 `json:"text_repetition_penalty"`
	Seed                  *int64   `json:"seed"`
}

// apply validates the fields and sets them on r over the defaults
// (pipeline.DefaultText and pipeline.DefaultAudio); a request without a
// seed gets a random one.
func (f *samplingFields) apply(r *pipeline.Request, seed func() int64) *apiError {
	var err *apiError
	r.AudioSampling, err = sampling(pipeline.DefaultAudio, "", f.Temperature, f.TopK, f.TopP, f.RepetitionPenalty)
	if err != nil {
		return err
	}
	r.TextSampling, err = sampling(pipeline.DefaultText, "text_", f.TextTemperature, f.TextTopK, f.TextTopP, f.TextRepetitionPenalty)
	if err != nil {
		return err
	}
	if f.Seed != nil {
		if *f.Seed < 0 || *f.Seed > maxSeed {
			return badRequest(codeInvalidValue, "seed", "seed %d outside [0, %d] (2^53 − 1, the integers JavaScript holds exactly)", *f.Seed, int64(maxSeed))
		}
		r.Seed = uint64(*f.Seed)
	} else {
		r.Seed = uint64(seed())
	}
	return nil
}

// sampling sets the given fields on def, checking the ranges
// pipeline.Sampling.Validate enforces so that the error names the field.
func sampling(def pipeline.Sampling, prefix string, temp *float64, topK *int, topP, rep *float64) (pipeline.Sampling, *apiError) {
	s := def
	if temp != nil {
		if *temp < 0 || *temp > 100 {
			return s, badRequest(codeInvalidValue, prefix+"temperature", "%s %v outside [0, 100] (0 is greedy)", prefix+"temperature", *temp)
		}
		s.Temperature = *temp
	}
	if topK != nil {
		if *topK < 0 {
			return s, badRequest(codeInvalidValue, prefix+"top_k", "%s %d is negative (0 keeps every entry)", prefix+"top_k", *topK)
		}
		s.TopK = *topK
	}
	if topP != nil {
		if *topP < 0 || *topP > 1 {
			return s, badRequest(codeInvalidValue, prefix+"top_p", "%s %v outside [0, 1]", prefix+"top_p", *topP)
		}
		s.TopP = *topP
	}
	if rep != nil {
		if *rep < 0 || *rep > 100 {
			return s, badRequest(codeInvalidValue, prefix+"repetition_penalty", "%s %v outside [0, 100] (1 is off)", prefix+"repetition_penalty", *rep)
		}
		s.RepetitionPenalty = *rep
	}
	if err := s.Validate(); err != nil { // the engine's own check; the ranges above match it
		return s, badRequest(codeInvalidValue, "", "%s sampling: %v", strings.TrimSuffix(prefix, "_"), err)
	}
	return s, nil
}

// maxNewTokens validates a requested max_new_tokens (nil: the engine's
// default, capped at the server's limit).
func maxNewTokens(v *int, param string, lim limits) (int, *apiError) {
	if v == nil {
		return min(512, lim.maxNewTokens), nil
	}
	if *v < 1 || *v > lim.maxNewTokens {
		return 0, badRequest(codeInvalidValue, param, "%s %d outside [1, %d]", param, *v, lim.maxNewTokens)
	}
	return *v, nil
}

// audioChatRequest is the body of POST /v1/audio/chat.
type audioChatRequest struct {
	Audio          *string `json:"audio"`
	Text           string  `json:"text"`
	System         string  `json:"system"`
	Stream         *bool   `json:"stream"`
	ConversationID string  `json:"conversation_id"`
	MaxNewTokens   *int    `json:"max_new_tokens"`
	samplingFields
}

// decodeAudioChat parses and validates a /v1/audio/chat body, decoding its
// WAV. Every failure is a 4xx naming the field.
func decodeAudioChat(body []byte, lim limits, seed func() int64) (*turnJob, *apiError) {
	var r audioChatRequest
	if err := unmarshal(body, &r); err != nil {
		return nil, err
	}
	job := &turnJob{conversationID: r.ConversationID, stream: r.Stream == nil || *r.Stream, audioParam: "audio", expectTurns: -1}
	if r.Audio == nil && strings.TrimSpace(r.Text) == "" {
		return nil, badRequest(codeMissingInput, "audio", "give audio (a base64 WAV), text, or both")
	}
	if r.Audio != nil {
		clip, err := decodeAudio(*r.Audio, "audio", lim)
		if err != nil {
			return nil, err
		}
		job.req.Audio = clip
	}
	if err := lim.checkText(r.Text, "text", "text"); err != nil {
		return nil, err
	}
	if err := lim.checkText(r.System, "system", "system"); err != nil {
		return nil, err
	}
	job.req.Text = r.Text
	job.req.System = r.System
	var err *apiError
	if job.req.MaxNewTokens, err = maxNewTokens(r.MaxNewTokens, "max_new_tokens", lim); err != nil {
		return nil, err
	}
	if err := r.samplingFields.apply(&job.req, seed); err != nil {
		return nil, err
	}
	return job, nil
}

// unmarshal decodes a JSON body, naming the field of a type mismatch.
func unmarshal(body []byte, v any) *apiError {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case len(body) == 0:
		return badRequest(codeInvalidJSON, "", "the request body is empty; send a JSON object")
	case errors.As(err, &syn):
		return badRequest(codeInvalidJSON, "", "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		typ.Field = strings.TrimPrefix(typ.Field, "samplingFields.") // the embedded struct's fields are top-level in JSON
		if typ.Field == "" {
			return badRequest(codeInvalidJSON, "", "the body must be a JSON object, not %s", typ.Value)
		}
		return badRequest(codeInvalidJSON, typ.Field, "field %s: want %s, got %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	}
	return badRequest(codeInvalidJSON, "", "malformed JSON: %v", err)
}

// jsonKind names a Go kind as JSON calls it.
func jsonKind(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"):
		return "an integer"
	case strings.HasPrefix(k, "float"):
		return "a number"
	case k == "bool":
		return "true or false"
	case k == "string":
		return "a string"
	case k == "slice":
		return "an array"
	}
	return "an object"
}

// decodeAudio decodes a base64 WAV (optionally a data: URL) into a clip.
func decodeAudio(s, param string, lim limits) (*audio.Clip, *apiError) {
	if strings.HasPrefix(s, "data:") {
		i := strings.Index(s, ";base64,")
		if i < 0 {
			return nil, badRequest(codeInvalidBase64, param, "a data: URL must be base64 (data:audio/wav;base64,…)")
		}
		s = s[i+len(";base64,"):]
	}
	if strings.TrimSpace(s) == "" {
		return nil, badRequest(codeAudioEmpty, param, "the audio is empty")
	}
	// StdEncoding skips \r and \n, so base64(1)'s wrapped lines decode.
	wav, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		if raw, rerr := base64.RawStdEncoding.DecodeString(s); rerr == nil { // unpadded
			wav, err = raw, nil
		}
	}
	if err != nil {
		var ci base64.CorruptInputError
		if errors.As(err, &ci) {
			return nil, badRequest(codeInvalidBase64, param, "not base64: illegal data at byte %d", int64(ci))
		}
		return nil, badRequest(codeInvalidBase64, param, "not base64: %v", err)
	}
	clip, err := audio.DecodeBytes(wav, audio.DecodeOptions{MaxDuration: lim.maxAudio})
	if err != nil {
		if errors.Is(err, audio.ErrTooLong) {
			return nil, badRequest(codeAudioTooLong, param, "%v (this server takes at most %s)", err, lim.maxAudio)
		}
		return nil, audioError(param, err)
	}
	return clip, nil
}

// describe renders a turnJob for logs.
func (j *turnJob) describe() string {
	a := "no audio"
	if j.req.Audio != nil {
		a = fmt.Sprintf("%.2f s of audio at %d Hz", j.req.Audio.Duration().Seconds(), j.req.Audio.SampleRate)
	}
	return fmt.Sprintf("%s, %d text bytes, max %d steps", a, len(j.req.Text), j.req.MaxNewTokens)
}
