package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// Error types, OpenAI's names.
const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

// Error codes: the machine-readable half of every error body, and the
// "kind" label of the errors metric. docs/api.md lists them.
const (
	codeInvalidJSON         = "invalid_json"
	codeMissingInput        = "missing_input"
	codeInvalidBase64       = "invalid_base64"
	codeInvalidAudio        = "invalid_audio"
	codeUnsupportedAudio    = "unsupported_audio_format"
	codeAudioTooLong        = "audio_too_long"
	codeAudioTooShort       = "audio_too_short"
	codeAudioEmpty          = "audio_empty"
	codeTextTooLong         = "text_too_long"
	codeBodyTooLarge        = "body_too_large"
	codeBodyTimeout         = "request_timeout"
	codeInvalidAPIKey       = "invalid_api_key"
	codeInvalidValue        = "invalid_value"
	codeUnsupportedValue    = "unsupported_value"
	codeUnknownConversation = "unknown_conversation"
	codeConversationBusy    = "conversation_busy"
	codeStaleAudioID        = "stale_audio_id"
	codeContextFull         = "context_length_exceeded"
	codeRateLimited         = "rate_limit_exceeded"
	codeTooManyConvs        = "too_many_conversations"
	codeMemoryFull          = "memory_budget_exceeded"
	codeDecodeBusy          = "decode_budget_exceeded"
	codeModelLoading        = "model_loading"
	codeShuttingDown        = "shutting_down"
	codeNotFound            = "not_found"
	codeMethodNotAllowed    = "method_not_allowed"
	codeInternal            = "internal_error"
	codeGeneration          = "generation_failed"
	codeCancelled           = "cancelled"
	codeSlowClient          = "slow_client"
)

// apiError is an error as the client receives it, in OpenAI's shape:
//
//	{"error": {"message": …, "type": …, "param": …, "code": …, "request_id": …}}
type apiError struct {
	Status     int     `json:"-"`
	Message    string  `json:"message"`
	Type       string  `json:"type"`
	Param      *string `json:"param"` // null when no one field is at fault
	Code       string  `json:"code"`
	RequestID  string  `json:"request_id,omitempty"`
	retryAfter time.Duration
}

func (e *apiError) Error() string {
	if e.Param != nil {
		return fmt.Sprintf("%d %s (%s): %s", e.Status, e.Code, *e.Param, e.Message)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// errorBody is the JSON object every error response and error event holds.
type errorBody struct {
	Error *apiError `json:"error"`
}

// badRequest is a 400 naming the field at fault ("" for none).
func badRequest(code, param, format string, args ...any) *apiError {
	return newError(http.StatusBadRequest, typeInvalidRequest, code, param, fmt.Sprintf(format, args...))
}

func newError(status int, typ, code, param, msg string) *apiError {
	e := &apiError{Status: status, Type: typ, Code: code, Message: msg}
	if param != "" {
		e.Param = &param
	}
	return e
}

func shuttingDown() *apiError {
	return newError(http.StatusServiceUnavailable, typeServer, codeShuttingDown, "", "the server is shutting down")
}

// audioError maps a WAV decoding error to the client's error naming param.
func audioError(param string, err error) *apiError {
	switch {
	case errors.Is(err, audio.ErrTooLong):
		return badRequest(codeAudioTooLong, param, "%v", err)
	case errors.Is(err, audio.ErrEmpty):
		return badRequest(codeAudioEmpty, param, "%v", err)
	case errors.Is(err, audio.ErrUnsupported):
		return badRequest(codeUnsupportedAudio, param, "%v", err)
	case errors.Is(err, audio.ErrTooShort):
		return badRequest(codeAudioTooShort, param, "%v", err)
	default: // ErrNotWAV, ErrMalformed, ErrTruncated
		return badRequest(codeInvalidAudio, param, "%v (send a WAV file, base64-encoded)", err)
	}
}

// startError maps an error of pipeline.Engine.Start; audioParam names the
// request's audio field.
func startError(err error, audioParam string, retryAfter time.Duration) *apiError {
	switch {
	case errors.Is(err, pipeline.ErrBusy):
		e := newError(http.StatusTooManyRequests, typeRateLimit, codeRateLimited, "", "the server is running its maximum number of turns; retry later")
		e.retryAfter = retryAfter
		return e
	case errors.Is(err, pipeline.ErrNoMemory):
		e := newError(http.StatusTooManyRequests, typeRateLimit, codeMemoryFull, "", err.Error()+"; retry later")
		e.retryAfter = retryAfter
		return e
	case errors.Is(err, pipeline.ErrSessionBusy):
		return newError(http.StatusConflict, typeInvalidRequest, codeConversationBusy, "conversation_id", "the conversation already has a turn running")
	case errors.Is(err, pipeline.ErrSessionClosed):
		return newError(http.StatusNotFound, typeInvalidRequest, codeUnknownConversation, "conversation_id", "the conversation was closed")
	case errors.Is(err, pipeline.ErrContextFull):
		return badRequest(codeContextFull, "max_new_tokens", "%v", err)
	case errors.Is(err, pipeline.ErrEmptyRequest):
		return badRequest(codeMissingInput, "", "%v", err)
	case errors.Is(err, audio.ErrTooShort):
		return audioError(audioParam, err)
	case errors.Is(err, pipeline.ErrEngineClosed):
		return shuttingDown()
	}
	return newError(http.StatusInternalServerError, typeServer, codeInternal, "", fmt.Sprintf("start the turn: %v", err))
}

// eventError maps the error that ended a running turn.
func eventError(err error) *apiError {
	switch {
	case errors.Is(err, pipeline.ErrSlowConsumer):
		return newError(http.StatusInternalServerError, typeServer, codeSlowClient, "", err.Error())
	case cancelled(err):
		return newError(http.StatusServiceUnavailable, typeServer, codeCancelled, "", "the turn was cancelled: "+err.Error())
	}
	return newError(http.StatusInternalServerError, typeServer, codeGeneration, "", err.Error())
}

// cancelled reports whether a turn ended because it was cancelled: its
// client hung up, or the server shut down.
func cancelled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, errShutdown) || errors.Is(err, pipeline.ErrEngineClosed)
}

// writeError sends e as the response (a request that has not started its
// reply yet).
func writeError(c echo.Context, e *apiError) error {
	if e.RequestID == "" {
		e.RequestID = requestID(c)
	}
	h := c.Response().Header()
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(e.retryAfter.Seconds()))))
	}
	return c.JSON(e.Status, errorBody{e})
}
