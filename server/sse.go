package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// sse writes a text/event-stream reply. Each event is flushed at once.
// There is no deadline on the whole stream (a reply may speak for
// minutes); instead each write must finish within stall, so a client that
// stops reading is dropped rather than holding its turn forever.
type sse struct {
	c     echo.Context
	rc    *http.ResponseController
	stall time.Duration
	buf   []byte
}

// startSSE sends the event-stream headers (and any extra ones).
func startSSE(c echo.Context, stall time.Duration, extra map[string]string) *sse {
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	for k, v := range extra {
		h.Set(k, v)
	}
	c.Response().WriteHeader(http.StatusOK)
	s := &sse{c: c, rc: http.NewResponseController(c.Response()), stall: stall}
	s.rc.Flush() // the headers reach the client before the first event
	return s
}

// event writes one event: an "event:" line when name is set, then data,
// which must be one line (compact JSON is).
func (s *sse) event(name string, data []byte) error {
	b := s.buf[:0]
	if name != "" {
		b = append(b, "event: "...)
		b = append(b, name...)
		b = append(b, '\n')
	}
	b = append(b, "data: "...)
	b = append(b, data...)
	b = append(b, "\n\n"...)
	s.buf = b
	if err := s.rc.SetWriteDeadline(time.Now().Add(s.stall)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	if _, err := s.c.Response().Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// json writes v as an event's data.
func (s *sse) json(name string, v any) error {
	data, err := marshal(v)
	if err != nil {
		return err
	}
	return s.event(name, data)
}

// end clears the write deadline: the connection may serve another request.
func (s *sse) end() {
	s.rc.SetWriteDeadline(time.Time{})
}

// marshal encodes v as compact JSON without escaping <, > and & (the
// model's text often holds them).
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil // Encode ends with a newline
}

// writeReply sends a whole JSON reply; like a stream's events, it must
// reach the client within the write-stall limit.
func (s *Server) writeReply(c echo.Context, data []byte) error {
	rc := http.NewResponseController(c.Response())
	rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteStall))
	defer rc.SetWriteDeadline(time.Time{})
	return c.JSONBlob(http.StatusOK, data)
}
