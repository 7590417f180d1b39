package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/pipeline"
)

// rtEvent is a server event as the client sees it.
type rtEvent map[string]any

func (e rtEvent) typ() string { s, _ := e["type"].(string); return s }

// str follows a path of keys ("response.status") to a string.
func (e rtEvent) str(path string) string { s, _ := e.get(path).(string); return s }

func (e rtEvent) num(path string) float64 { f, _ := e.get(path).(float64); return f }

func (e rtEvent) get(path string) any {
	var v any = map[string]any(e)
	for k := range strings.SplitSeq(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// rtClient is a test's realtime connection.
type rtClient struct {
	t    testing.TB
	ws   *websocket.Conn
	seen []rtEvent // every event read, in order
}

func rtURL(ts *testServer) string { return "ws" + strings.TrimPrefix(ts.url, "http") + "/v1/realtime" }

// dialRT connects to /v1/realtime and reads session.created.
func dialRT(t testing.TB, ts *testServer, opts *websocket.DialOptions) *rtClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, rtURL(ts), opts)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial /v1/realtime: %v (HTTP %d)", err, status)
	}
	ws.SetReadLimit(64 << 20)
	c := &rtClient{t: t, ws: ws}
	t.Cleanup(func() { ws.CloseNow() })
	if ev := c.next(); ev.typ() != "session.created" {
		t.Fatalf("first event %v, want session.created", ev)
	}
	return c
}

func (c *rtClient) send(ev map[string]any) {
	c.t.Helper()
	data, err := json.Marshal(ev)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendRaw(data)
}

func (c *rtClient) sendRaw(data []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, data); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// next reads one event.
func (c *rtClient) next() rtEvent {
	c.t.Helper()
	ev, err := c.read(30 * time.Second)
	if err != nil {
		c.t.Fatalf("read an event (after %s): %v", c.types(), err)
	}
	return ev
}

func (c *rtClient) read(timeout time.Duration) (rtEvent, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		return nil, err
	}
	var ev rtEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return nil, err
	}
	if ev.str("event_id") == "" {
		c.t.Errorf("server event %s has no event_id", ev.typ())
	}
	c.seen = append(c.seen, ev)
	return ev, nil
}

// until reads events up to and including the first of type typ, and
// returns them.
func (c *rtClient) until(typ string) []rtEvent {
	c.t.Helper()
	var out []rtEvent
	for {
		ev := c.next()
		out = append(out, ev)
		if ev.typ() == typ {
			return out
		}
	}
}

// types lists the types of the last events seen.
func (c *rtClient) types() string {
	var b []string
	for _, ev := range c.seen[max(0, len(c.seen)-12):] {
		if ev.typ() == "error" {
			b = append(b, "error("+ev.str("error.code")+": "+ev.str("error.message")+")")
			continue
		}
		b = append(b, ev.typ())
	}
	return strings.Join(b, ", ")
}

// expectError reads up to an error event and checks its code (and param).
func (c *rtClient) expectError(code, param, eventID string) rtEvent {
	c.t.Helper()
	evs := c.until("error")
	ev := evs[len(evs)-1]
	if got := ev.str("error.code"); got != code {
		c.t.Errorf("error code %q (%s), want %q", got, ev.str("error.message"), code)
	}
	if param != "" && ev.str("error.param") != param {
		c.t.Errorf("error param %q, want %q (%s)", ev.str("error.param"), param, ev.str("error.message"))
	}
	if eventID != "" && ev.str("error.event_id") != eventID {
		c.t.Errorf("error event_id %q, want %q", ev.str("error.event_id"), eventID)
	}
	if ev.str("error.message") == "" || ev.str("error.type") == "" {
		c.t.Errorf("error without type or message: %v", ev)
	}
	return ev
}

// pcmB64 encodes samples as the wire's base64 PCM16.
func pcmB64(pcm []float32) string { return base64.StdEncoding.EncodeToString(audio.PCM16LE(pcm)) }

// appendAudio streams pcm in 40 ms events.
func (c *rtClient) appendAudio(pcm []float32) {
	c.t.Helper()
	for i := 0; i < len(pcm); i += 960 {
		c.send(map[string]any{"type": "input_audio_buffer.append", "audio": pcmB64(pcm[i:min(len(pcm), i+960)])})
	}
}

// utterance is lead of quiet, a voiced sound of speech long (a vowel-like
// buzz at about -17 dBFS), and tail of quiet, at 24 kHz. The quiet is a
// microphone's noise (about -65 dBFS), not digital silence, which the VAD's
// noise floor ignores.
func utterance(lead, speech, tail time.Duration) []float32 {
	n := func(d time.Duration) int { return int(d.Seconds() * rtRate) }
	pcm := make([]float32, n(lead)+n(speech)+n(tail))
	rng := uint32(1)
	for i := range pcm {
		rng = rng*1664525 + 1013904223
		pcm[i] = (float32(rng>>8)/(1<<24) - 0.5) * 0.002
	}
	for i := range n(speech) {
		x := float64(i) / rtRate
		v := 0.0
		for h := 1; h <= 5; h++ {
			v += math.Sin(2*math.Pi*140*float64(h)*x) / float64(h)
		}
		pcm[n(lead)+i] += float32(0.12 * v)
	}
	return pcm
}

// rtLongTeacher keeps a reply going to its max_output_tokens: no end of
// text, turn or audio.
type rtLongTeacher struct{ imEnd, textEnd, eoa int }

func (r rtLongTeacher) Text(_, picked int, _ []float32) int {
	if picked == r.imEnd || picked == r.textEnd {
		return 300
	}
	return picked
}

func (r rtLongTeacher) AudioCode(_, _, picked int, _ []float32) int {
	if picked == r.eoa {
		return 0
	}
	return picked
}

// longReplies makes every turn of ts run to its max_output_tokens.
func longReplies(ts *testServer) {
	sp := ts.eng.Model().Info().Special
	ts.hookStart = func(req *pipeline.Request) { req.Teacher = rtLongTeacher{sp.IMEnd, sp.TextEnd, sp.EOA} }
}

func bearer(key string) *websocket.DialOptions {
	return &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}}
}
