package lfm2audio

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/stages/detok"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

// detokFixture is the tiny LFM2.5 detokenizer made with the official
// liquid-audio code (see its README.md).
const detokFixture = "../../testdata/lfm25-detok-tiny"

// TestCodecChoice: an LFM2.5 folder decodes with the detokenizer by
// default, Options.Codec picks Mimi when both are present, and asking for
// a codec the folder lacks, or an unknown one, is an error.
func TestCodecChoice(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	both, only := testmodel.LFM25Tiny(t, true), testmodel.LFM25Tiny(t, false)
	for _, tc := range []struct {
		name, dir, codec, want, err string
	}{
		{"LFM2-Audio default", tiny, "", CodecMimi, ""},
		{"LFM2.5 default", both, "", CodecDetokenizer, ""},
		{"LFM2.5 without Mimi", only, "", CodecDetokenizer, ""},
		{"LFM2.5 asks for mimi", both, CodecMimi, CodecMimi, ""},
		{"LFM2.5 asks for the detokenizer", both, CodecDetokenizer, CodecDetokenizer, ""},
		{"no Mimi weights", only, CodecMimi, "", "no Mimi weights"},
		{"no detokenizer", tiny, CodecDetokenizer, "", "no audio_detokenizer"},
		{"unknown", both, "wavenet", "", `unknown codec "wavenet"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := LoadWith(dev, tc.dir, Options{Codec: tc.codec})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Codec.Kind() != tc.want {
				t.Errorf("codec %s, want %s", m.Codec.Kind(), tc.want)
			}
			if m.Special.EOA != 2048 || m.Codec.FrameSamples() != 1920 || m.Codec.SampleRate() != 24000 {
				t.Errorf("EOA %d, %d samples per frame at %d Hz", m.Special.EOA, m.Codec.FrameSamples(), m.Codec.SampleRate())
			}
			if !strings.Contains(m.Summary(), "codec: "+tc.want) {
				t.Errorf("summary does not name the codec:\n%s", m.Summary())
			}
		})
	}
}

// TestDetokenizerCodecStream: through the Codec interface a stream's
// frames and flush equal the whole decode, and an end-of-audio code is
// refused.
func TestDetokenizerCodecStream(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	m, err := Load(dev, testmodel.LFM25Tiny(t, false))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	codes := make([][]int, 9)
	for f := range codes {
		codes[f] = []int{f, 100 + f, 200, 300, 2047, 0, 7 * f, 1000}
	}
	whole, err := m.Codec.Decode(ctx, codes)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole) != 9*1920 {
		t.Fatalf("%d samples, want %d", len(whole), 9*1920)
	}
	s := m.Codec.NewStream()
	defer s.Close()
	var got []float32
	for f := range codes {
		pcm, err := s.DecodeFrames(ctx, codes[f:f+1])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, pcm...)
	}
	if _, err := s.DecodeFrames(ctx, [][]int{{2048, 0, 0, 0, 0, 0, 0, 0}}); !errors.Is(err, detok.ErrEndOfAudio) {
		t.Errorf("end-of-audio frame: %v", err)
	}
	got = append(got, s.Flush()...)
	if !slices.Equal(got, whole) {
		t.Error("streamed samples differ from the whole decode")
	}
}

// TestMimiBatchCodec: LFM2-Audio's Mimi codec batches streams
// (family.BatchCodec): two streams' frames decoded in one call, over two
// calls of ragged lengths, equal each stream's own decode bit for bit; a
// stream of another codec is refused.
func TestMimiBatchCodec(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	m, err := LoadWith(dev, testmodel.LFM25Tiny(t, true), Options{Codec: CodecMimi})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	bc, ok := m.Codec.(family.BatchCodec)
	if !ok {
		t.Fatalf("the Mimi codec (%T) does not batch", m.Codec)
	}
	frames := func(n, seed int) [][]int { return testFrames(m, n, seed) }
	ctx := context.Background()
	a := batchEqualsOwn(t, m, bc, false, [][][][]int{ // calls[c][i]: stream i's frames in call c
		{frames(1, 1), frames(3, 2)},
		{frames(2, 3), frames(1, 4)},
	})[0]

	dm, err := LoadWith(dev, testmodel.LFM25Tiny(t, true), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dm.Close()
	ds := dm.Codec.NewStream()
	defer ds.Close()
	if _, err := bc.DecodeBatch(ctx, []CodecStream{a, ds}, [][][]int{frames(1, 0), frames(1, 0)}); err == nil {
		t.Error("a detokenizer stream in a Mimi batch was accepted")
	}
}

// TestDetokenizerBatchCodec: LFM2.5-Audio's detokenizer batches streams
// (family.BatchCodec): three streams' frames decoded in shared calls, over
// calls of ragged lengths (a stream sitting one out, 1-frame calls), and
// their flushes equal each stream's own decode bit for bit; a Mimi stream
// and a bad code are refused before any stream advances; an ended context
// is refused.
func TestDetokenizerBatchCodec(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	m, err := LoadWith(dev, testmodel.LFM25Tiny(t, true), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Codec.Kind() != CodecDetokenizer {
		t.Fatalf("codec %s", m.Codec.Kind())
	}
	bc, ok := m.Codec.(family.BatchCodec)
	if !ok {
		t.Fatalf("the detokenizer codec (%T) does not batch", m.Codec)
	}
	frames := func(n, seed int) [][]int { return testFrames(m, n, seed) }
	ctx := context.Background()
	batchEqualsOwn(t, m, bc, true, [][][][]int{ // calls[c][i]: stream i's frames in call c
		{frames(1, 1), frames(3, 2), frames(1, 9)},
		{frames(2, 3), frames(1, 4), nil},
		{frames(1, 5), frames(1, 6), frames(4, 10)},
	})

	mm, err := LoadWith(dev, testmodel.LFM25Tiny(t, true), Options{Codec: CodecMimi})
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Close()
	ms := mm.Codec.NewStream()
	defer ms.Close()
	a, b := m.Codec.NewStream(), m.Codec.NewStream()
	defer a.Close()
	defer b.Close()
	eoa := frames(2, 7)
	eoa[1][3] = 2048
	for _, c := range []struct {
		name    string
		streams []CodecStream
		codes   [][][]int
		ctx     context.Context
		is      error
	}{
		{"a Mimi stream", []CodecStream{a, ms}, [][][]int{frames(1, 0), frames(1, 0)}, ctx, nil},
		{"end of audio", []CodecStream{a, b}, [][][]int{frames(1, 0), eoa}, ctx, detok.ErrEndOfAudio},
		{"twice", []CodecStream{a, a}, [][][]int{frames(1, 0), frames(1, 0)}, ctx, nil},
		{"ended context", []CodecStream{a, b}, [][][]int{frames(1, 0), frames(1, 0)}, cancelled(), context.Canceled},
	} {
		if _, err := bc.DecodeBatch(c.ctx, c.streams, c.codes); err == nil {
			t.Errorf("%s: accepted", c.name)
		} else if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: error %v, want one wrapping %v", c.name, err, c.is)
		}
	}
	// The refused streams did not advance: they still decode as fresh ones.
	out, err := bc.DecodeBatch(ctx, []CodecStream{a, b}, [][][]int{frames(2, 8), frames(2, 8)})
	if err != nil {
		t.Fatal(err)
	}
	fresh := m.Codec.NewStream()
	defer fresh.Close()
	want, err := fresh.DecodeFrames(ctx, frames(2, 8))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out[0], want) || !slices.Equal(out[1], want) {
		t.Error("the refused streams advanced")
	}
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// testFrames returns n frames of valid codes for m's codec, varied by seed.
func testFrames(m *Model, n, seed int) [][]int {
	out := make([][]int, n)
	for f := range out {
		for k := range m.Codec.Codebooks() {
			out[f] = append(out[f], (seed*131+f*17+k*7)%2048)
		}
	}
	return out
}

// batchEqualsOwn decodes calls (calls[c][i]: stream i's frames in call c)
// on fresh streams through bc, flushing them at the end when flush is set,
// and checks that each stream's samples equal, bit for bit, those of its
// own decode of the same frames. It returns the batched streams (closed
// when t ends).
func batchEqualsOwn(t *testing.T, m *Model, bc family.BatchCodec, flush bool, calls [][][][]int) []CodecStream {
	t.Helper()
	ctx := context.Background()
	n := len(calls[0])
	streams := make([]CodecStream, n)
	for i := range streams {
		streams[i] = m.Codec.NewStream()
		t.Cleanup(func() { streams[i].Close() })
	}
	got := make([][]float32, n)
	for _, call := range calls {
		out, err := bc.DecodeBatch(ctx, streams, call)
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			got[i] = append(got[i], out[i]...)
		}
	}
	for i := range streams {
		s := m.Codec.NewStream()
		var want []float32
		frames := 0
		for _, call := range calls {
			pcm, err := s.DecodeFrames(ctx, call[i])
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, pcm...)
			frames += len(call[i])
		}
		if flush {
			got[i] = append(got[i], streams[i].Flush()...)
			want = append(want, s.Flush()...)
		}
		s.Close()
		if len(want) != frames*m.Codec.FrameSamples() || !slices.Equal(got[i], want) {
			t.Errorf("stream %d: the batched decode's %d samples differ from its own decode's %d", i, len(got[i]), len(want))
		}
	}
	return streams
}

// TestDecodeBatchRefusesForeignStreams: a batch naming a stream of the
// other codec is an error naming its index, before any decoder runs.
func TestDecodeBatchRefusesForeignStreams(t *testing.T) {
	ctx := context.Background()
	if _, err := (mimiCodec{}).DecodeBatch(ctx, []CodecStream{mimiStream{}, detokStream{}}, make([][][]int, 2)); err == nil ||
		!strings.Contains(err.Error(), "stream 1 of the batch") || !strings.Contains(err.Error(), "not a Mimi stream") {
		t.Errorf("mimi codec with a detokenizer stream: %v", err)
	}
	if _, err := (detokCodec{}).DecodeBatch(ctx, []CodecStream{mimiStream{}}, make([][][]int, 1)); err == nil ||
		!strings.Contains(err.Error(), "stream 0 of the batch") || !strings.Contains(err.Error(), "not a detokenizer stream") {
		t.Errorf("detokenizer codec with a Mimi stream: %v", err)
	}
}
