package server

import (
	"bytes"
	"encoding/base64"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// audioChatDone is the data of the done event (and, with the audio, the
// non-streaming reply) of /v1/audio/chat.
type audioChatDone struct {
	ConversationID string       `json:"conversation_id"`
	Text           string       `json:"text"`
	Audio          *string      `json:"audio,omitempty"`       // base64 WAV; non-streaming only
	SampleRate     int          `json:"sample_rate,omitempty"` // non-streaming only
	Stop           string       `json:"stop"`
	Seed           int64        `json:"seed"`
	Timings        *timingsJSON `json:"timings"`
}

// audioChat serves POST /v1/audio/chat: one turn, streamed as server-sent
// events (text, audio, then done or error) or, with "stream": false,
// answered by one JSON object.
func (s *Server) audioChat(c echo.Context) error {
	be, job, t, aerr := begin(s, c, decodeAudioChat, func(j *turnJob) *turnJob { return j })
	if aerr != nil {
		return aerr
	}
	if !job.stream {
		return s.audioChatJSON(c, be, t, job)
	}

	st := startSSE(c, s.cfg.WriteStall, map[string]string{headerConversationID: t.conv.id})
	defer st.end()
	var buf []byte
	done, fail := t.events(
		func(delta string) error {
			return st.json("text", struct {
				Delta string `json:"delta"`
			}{delta})
		},
		func(ev *pipeline.AudioEvent) error {
			buf = appendAudioEvent(buf[:0], ev)
			return st.event("audio", buf)
		})
	if done != nil {
		st.json("done", audioChatDone{ConversationID: t.conv.id, Text: done.Text, Stop: done.Stop.String(),
			Seed: int64(job.req.Seed), Timings: newTimings(done.Timings)})
		return nil
	}
	s.streamError(c, st, "error", fail.Err)
	return nil
}

// audioChatJSON collects the turn into one JSON reply with a WAV.
func (s *Server) audioChatJSON(c echo.Context, be *Backend, t *turn, job *turnJob) error {
	var pcm []float32
	rate := be.Engine.Model().AudioCodec().SampleRate()
	done, fail := t.events(
		func(string) error { return nil },
		func(ev *pipeline.AudioEvent) error {
			pcm, rate = append(pcm, ev.Samples...), ev.Rate
			return nil
		})
	if fail != nil {
		return eventError(fail.Err)
	}
	var wav bytes.Buffer
	if err := audio.WriteWAV(&wav, rate, pcm); err != nil {
		return err
	}
	b64 := base64.StdEncoding.EncodeToString(wav.Bytes())
	data, err := marshal(audioChatDone{ConversationID: t.conv.id, Text: done.Text, Audio: &b64, SampleRate: rate,
		Stop: done.Stop.String(), Seed: int64(job.req.Seed), Timings: newTimings(done.Timings)})
	if err != nil {
		return err
	}
	c.Response().Header().Set(headerConversationID, t.conv.id)
	return s.writeReply(c, data)
}

// appendAudioEvent appends {"seq":N,"pcm":"<base64 PCM16LE>"}.
func appendAudioEvent(b []byte, ev *pipeline.AudioEvent) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendInt(b, int64(ev.Seq), 10)
	b = append(b, `,"pcm":"`...)
	b = base64.StdEncoding.AppendEncode(b, audio.PCM16LE(ev.Samples))
	return append(b, `"}`...)
}

// streamError ends a stream whose turn failed with an error event (name
// "" for OpenAI's bare data line).
func (s *Server) streamError(c echo.Context, st *sse, name string, err error) {
	ae := eventError(err)
	ae.RequestID = requestID(c)
	s.met.errors.WithLabelValues(ae.Code).Inc()
	st.json(name, errorBody{ae})
}
