package detok

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
)

// streamDecode decodes codes chunk frames at a time and flushes, checking
// each call's sample count: after frame t the stream has emitted
// 1920·(t+1) − 480 samples, and the flush the last 480.
func streamDecode(t *testing.T, d *Decoder, codes [][]int, chunk int) []float32 {
	t.Helper()
	s := d.NewStream()
	defer s.Close()
	var out []float32
	for lo := 0; lo < len(codes); lo += chunk {
		hi := min(lo+chunk, len(codes))
		var err error
		if out, err = s.AppendDecode(out, codes[lo:hi]); err != nil {
			t.Fatal(err)
		}
		if want := d.FrameSamples()*hi - d.Lag(); len(out) != want {
			t.Fatalf("chunk %d: after %d frames %d samples, want %d", chunk, hi, len(out), want)
		}
		for i, b := range d.net.Blocks {
			// Whole KV blocks: the last window−1 positions and less than a block more.
			if b.Attn != nil && b.Attn.Window > 0 && s.cache.Held(i) > b.Attn.Window-1+s.cache.BlockRows()-1 {
				t.Fatalf("layer %d holds %d positions, window %d, blocks of %d", i, s.cache.Held(i), b.Attn.Window, s.cache.BlockRows())
			}
		}
	}
	tail := s.Flush()
	if len(tail) != d.Lag() {
		t.Fatalf("flush: %d samples, want %d", len(tail), d.Lag())
	}
	if again := s.Flush(); len(again) != 0 {
		t.Errorf("second flush: %d samples", len(again))
	}
	if _, err := s.Decode(codes[:1]); err == nil {
		t.Error("decode after Flush succeeded")
	}
	return append(out, tail...)
}

// TestStreamEqualsWhole: streaming 1, 2 or 5 frames at a time gives the
// whole decode's samples bit for bit (through the 30-step window of
// detok_T40), and the fixture's waveform, on every device (see
// forEachDevice).
func TestStreamEqualsWhole(t *testing.T) { forEachDevice(t, testStreamEqualsWhole) }

func testStreamEqualsWhole(t *testing.T, d *Decoder) {
	for _, name := range []string{"detok_T7", "detok_T40"} {
		ref := readCase(t, name)
		whole, err := d.Decode(ref.codes)
		if err != nil {
			t.Fatal(err)
		}
		for _, chunk := range []int{1, 2, 5} {
			got := streamDecode(t, d, ref.codes, chunk)
			if !slices.Equal(got, whole) {
				t.Errorf("%s: chunks of %d differ from the whole decode", name, chunk)
			}
			if e := numcmp.Compare(got, ref.wav); e.MaxAbs > 4*3.05e-7 || e.NaNs > 0 {
				t.Errorf("%s: chunks of %d: max abs %.3g from the reference", name, chunk, e.MaxAbs)
			}
		}
	}
}

// TestCodeGuard: a frame with a code outside 0..2047 (the end-of-audio
// code 2048 included) or the wrong number of codes is refused by Decode
// and by a stream, which is left as it was.
func TestCodeGuard(t *testing.T) {
	d := loadFixture(t)
	ref := readCase(t, "detok_T7")
	good := ref.codes
	frame := func(k, code int) [][]int {
		f := slices.Clone(good[0])
		f[k] = code
		return [][]int{good[1], f}
	}
	for _, tc := range []struct {
		name  string
		codes [][]int
		eoa   bool
	}{
		{"negative", frame(3, -1), false},
		{"end of audio", frame(0, 2048), true},
		{"all end of audio", [][]int{{2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}}, true},
		{"beyond", frame(7, 2049), false},
		{"huge", frame(2, 1<<40), false},
		{"seven codes", [][]int{good[0][:7]}, false},
		{"nine codes", [][]int{append(slices.Clone(good[0]), 0)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := d.Decode(tc.codes); err == nil {
				t.Fatal("Decode accepted it")
			} else if errors.Is(err, ErrEndOfAudio) != tc.eoa {
				t.Errorf("Decode: %v; wraps ErrEndOfAudio %v, want %v", err, !tc.eoa, tc.eoa)
			}
			s := d.NewStream()
			defer s.Close()
			if _, err := s.Decode(tc.codes); err == nil {
				t.Fatal("stream accepted it")
			}
			if s.Frames() != 0 || s.cache.Len() != 0 {
				t.Fatalf("refused codes advanced the stream to %d frames, %d positions", s.Frames(), s.cache.Len())
			}
			got, err := s.Decode(good)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, s.Flush()...)
			if e := numcmp.Compare(got, ref.wav); e.MaxAbs > 4*3.05e-7 || e.NaNs > 0 {
				t.Errorf("after the refusal the stream decodes with max abs %.3g", e.MaxAbs)
			}
		})
	}
}

// TestWindowFromConfig: the attention window is the config's
// sliding_window: another value binds another window and changes the
// samples of a decode longer than it.
func TestWindowFromConfig(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(fixtureDir, DirName)
	data, err := os.ReadFile(filepath.Join(src, ConfigName))
	if err != nil {
		t.Fatal(err)
	}
	data = []byte(strings.Replace(string(data), `"sliding_window": 30`, `"sliding_window": 7`, 1))
	if err := os.WriteFile(filepath.Join(dir, ConfigName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(filepath.Join(src, WeightsName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join(dir, WeightsName)); err != nil {
		t.Fatal(err)
	}
	dev := cpu.New(2)
	defer dev.Close()
	d, err := Load(dev, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	n := 0
	for _, b := range d.net.Blocks {
		if b.Attn != nil {
			n++
			if b.Attn.Window != 7 {
				t.Errorf("window %d, want 7", b.Attn.Window)
			}
		}
	}
	if n == 0 {
		t.Fatal("no attention layers")
	}
	ref := readCase(t, "detok_T7")
	got, err := d.Decode(ref.codes)
	if err != nil {
		t.Fatal(err)
	}
	if e := numcmp.Compare(got, ref.wav); e.MaxAbs < 1e-3 {
		t.Errorf("window 7 decodes like window 30 (max abs %.3g)", e.MaxAbs)
	}
	if s := streamDecode(t, d, ref.codes, 2); !slices.Equal(s, got) {
		t.Error("window 7: streamed samples differ from the whole decode")
	}
}
