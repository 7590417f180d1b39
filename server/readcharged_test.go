package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// TestReadChargedRefusesEarly: a client event larger than the decode
// budget lets it hold is refused once its charge stops fitting — the
// event's bytes are charged as they arrive, never read ahead of their
// charge — with its event_id found after megabytes of audio, and nothing
// left reserved; an event that fits is returned whole and charged exactly
// decodeCost of its length; a reader's error returns with nothing
// reserved.
func TestReadChargedRefusesEarly(t *testing.T) {
	audio := strings.Repeat("QUJD", 1<<18) // 1 MiB of base64
	big := `{"audio":"` + audio + `","type":"input_audio_buffer.append","event_id":"evt_big"}`
	small := `{"type":"input_audio_buffer.commit","event_id":"evt_small"}`
	for _, c := range []struct {
		name    string
		budget  int64
		msg     string
		refused bool
	}{
		{"fits", decodeCost(int64(len(big))) * 3, big, false},
		{"small in a small budget", decodeCost(4096), small, false},
		{"fills its chunks exactly", decodeCost(rtReadFirst + rtReadFirst), strings.Repeat(" ", 2*rtReadFirst-len(small)) + small, false},
		{"refused after its first chunks", decodeCost(4096), big, true},
		{"refused at once", 0, small, true}, // another holds the whole budget
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newByteBudget(max(c.budget, decodeCost(4096)))
			if c.budget == 0 {
				other, err := b.acquire(context.Background(), b.max, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer other.release()
				defer func() {
					if n := b.inUse(); n != b.max {
						t.Errorf("%d bytes reserved beside the other's %d", n-b.max, b.max)
					}
				}()
			}
			r := &watchReader{r: iotest.HalfReader(strings.NewReader(c.msg)), b: b}
			data, res, ref, err := readCharged(context.Background(), b, 0, r)
			if err != nil {
				t.Fatal(err)
			}
			if c.refused {
				if ref == nil || data != nil || res != nil {
					t.Fatalf("refusal %+v, %d bytes, reservation %v: want a refusal alone", ref, len(data), res)
				}
				if !errors.Is(ref.err, errDecodeBusy) || ref.bytes != int64(len(c.msg)) {
					t.Errorf("refusal %v of %d bytes, want errDecodeBusy of %d", ref.err, ref.bytes, len(c.msg))
				}
				if want := eventIDRef([]byte(c.msg)); ref.eventID != want || want == "" {
					t.Errorf("refused event's id %q, want %q", ref.eventID, want)
				}
			} else {
				if ref != nil || !bytes.Equal(data, []byte(c.msg)) {
					t.Fatalf("refusal %+v, %d bytes: want the message whole", ref, len(data))
				}
				if got, want := b.inUse(), decodeCost(int64(len(c.msg))); got != want {
					t.Errorf("%d bytes reserved for a message of %d, want %d", got, len(c.msg), want)
				}
				res.release()
			}
			if n := b.inUse(); n != 0 && c.budget != 0 {
				t.Errorf("%d bytes left reserved", n)
			}
			// Read ahead of the charge: never more than the one byte that
			// says whether a full buffer's message goes on.
			if r.maxAhead > decodeCost(1) {
				t.Errorf("read %d bytes past the charge (decodeCost of the bytes read exceeded the reservation)", r.maxAhead)
			}
			if r.uncharge > 0 && c.budget != 0 {
				t.Errorf("read %d bytes before charging any", r.uncharge)
			}
		})
	}
	t.Run("reader error", func(t *testing.T) {
		b := newByteBudget(decodeCost(1 << 22))
		r := io.MultiReader(strings.NewReader(big[:100000]), iotest.ErrReader(errors.New("connection reset")))
		if _, _, _, err := readCharged(context.Background(), b, 0, r); err == nil || err.Error() != "connection reset" {
			t.Errorf("error %v, want the reader's", err)
		}
		if n := b.inUse(); n != 0 {
			t.Errorf("%d bytes left reserved", n)
		}
	})
	t.Run("waits for budget", func(t *testing.T) {
		b := newByteBudget(decodeCost(4096))
		other, err := b.acquire(context.Background(), decodeCost(4096), 0)
		if err != nil {
			t.Fatal(err)
		}
		go func() { time.Sleep(20 * time.Millisecond); other.release() }()
		data, res, ref, err := readCharged(context.Background(), b, 5*time.Second, strings.NewReader(small))
		if err != nil || ref != nil || string(data) != small {
			t.Fatalf("%q, %+v, %v: want the message once the budget came free", data, ref, err)
		}
		res.release()
	})
}

// watchReader records, at every read, how far the bytes read so far run
// ahead of what the budget holds (decodeCost of them against inUse).
type watchReader struct {
	r        io.Reader
	b        *byteBudget
	read     int64
	maxAhead int64
	seenHeld bool
	uncharge int64 // bytes read before any charge
}

func (w *watchReader) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	w.read += int64(n)
	// A refused event's rest is scanned with nothing reserved, after
	// reads under a charge; bytes read before any charge are buffered
	// unseen.
	held := w.b.inUse()
	if held == 0 && !w.seenHeld {
		w.uncharge += int64(n)
	}
	w.seenHeld = w.seenHeld || held > 0
	if held > 0 && decodeCost(w.read)-held > w.maxAhead {
		w.maxAhead = decodeCost(w.read) - held
	}
	return n, err
}

// eventIDRef is what scanEventID must find on a well-formed event: the
// top-level event_id string as encoding/json decodes it.
func eventIDRef(data []byte) string {
	var h map[string]any
	if decodeJSONStrict(data, &h) != nil {
		return ""
	}
	id, _ := h["event_id"].(string)
	if len(id) > 512 {
		return ""
	}
	return id
}

func decodeJSONStrict(data []byte, v any) error { return json.Unmarshal(data, v) }

// TestScanEventID: the streamed id scanner on ids before and after large
// values, escapes, nested event_id keys (not the event's), ids that are not
// strings or are too long, and text that is not a JSON object; every input
// fed whole and split at every byte gives the same answer.
func TestScanEventID(t *testing.T) {
	long := strings.Repeat("x", 513)
	for _, c := range []struct {
		in, want string
	}{
		{`{"event_id":"evt_1","type":"x"}`, "evt_1"},
		{`{"audio":"AAAA","event_id":"evt_2"}`, "evt_2"},
		{` { "type" : "x" , "event_id" : "e\"v\\t\u00e9" } `, "e\"v\\t\u00e9"},
		{`{"item":{"event_id":"inner"},"type":"x"}`, ""},
		{`{"item":{"event_id":"inner"},"event_id":"outer"}`, "outer"},
		{`{"arr":["event_id","evt_no"],"type":"x"}`, ""},
		{`{"event_id":12}`, ""},
		{`{"event_id":"` + long + `"}`, ""},
		{`{"event_idx":"no","event_id":"yes"}`, "yes"},
		{`["event_id","evt"]`, ""},
		{`"event_id"`, ""},
		{``, ""},
		{`{"a":"\"event_id\":\"fake\"","event_id":"real"}`, "real"},
	} {
		for split := 0; split <= len(c.in); split++ {
			n, got, err := scanEventID([]byte(c.in[:split]), iotest.OneByteReader(strings.NewReader(c.in[split:])))
			if err != nil || got != c.want || n != int64(len(c.in)) {
				t.Fatalf("%q split at %d: %d bytes, %q, %v; want %q", c.in, split, n, got, err, c.want)
			}
		}
	}
}

// FuzzScanEventID: on any text the scanner holds no more than its bounds,
// reads every byte, gives the same id however the text is split, and on a
// valid JSON object naming event_id once agrees with encoding/json.
func FuzzScanEventID(f *testing.F) {
	for _, s := range []string{
		`{"event_id":"evt_1","type":"x"}`, `{"audio":"AAAA","event_id":"e\"2"}`,
		`{"item":{"event_id":"inner"},"event_id":"outer"}`, `[{"event_id":"x"}]`, `{"event_id":"\ud83d\ude00"}`, `{`,
	} {
		f.Add([]byte(s), 3)
	}
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		n, whole, err := scanEventID(data, bytes.NewReader(nil))
		if err != nil || n != int64(len(data)) {
			t.Fatalf("%d bytes, %v", n, err)
		}
		split = min(max(split, 0), len(data))
		if _, parts, _ := scanEventID(data[:split], iotest.OneByteReader(bytes.NewReader(data[split:]))); parts != whole {
			t.Fatalf("split at %d: %q, whole: %q", split, parts, whole)
		}
		if len(whole) > 512 {
			t.Fatalf("id of %d bytes", len(whole))
		}
		if json.Valid(data) && bytes.Count(data, []byte("event_id")) == 1 && bytes.Count(bytes.ToLower(data), []byte("event_id")) == 1 {
			if want := eventIDRef(data); want != whole {
				t.Fatalf("%q: scanned %q, encoding/json %q", data, whole, want)
			}
		}
	})
}

// TestReadChargedWaitsOnce: the chunks of one event share one wait. The
// budget frees 64 KiB's charge every 20 ms, so each chunk of a 512 KiB
// event could be had within a 100 ms wait of its own, but all of them
// need at least 160 ms: the event must be refused.
func TestReadChargedWaitsOnce(t *testing.T) {
	b := newByteBudget(decodeCost(1 << 20))
	other, err := b.acquire(context.Background(), decodeCost(1<<20)-decodeCost(4096), 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	freed := make(chan struct{})
	go func() {
		defer close(freed)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				other.shrink(other.n.Load() - decodeCost(64<<10))
			}
		}
	}()
	defer func() { close(done); <-freed; other.release() }()
	// 512 KiB exactly: the chunks up to 256 KiB hold it, none more.
	msg := `{"audio":"` + strings.Repeat("A", 1<<19-34) + `","event_id":"evt_slow"}`
	data, res, ref, err := readCharged(context.Background(), b, 100*time.Millisecond, strings.NewReader(msg))
	if err != nil || ref == nil || ref.eventID != "evt_slow" {
		res.release()
		t.Fatalf("%d bytes, refusal %+v, %v: want evt_slow refused (its chunks' waits add up past the wait)", len(data), ref, err)
	}
}
