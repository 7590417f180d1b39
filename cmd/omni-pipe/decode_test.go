package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// detokCase is a reference decode of 7 frames, made with the official
// liquid-audio code (see testdata/lfm25-detok-tiny/README.md).
const detokCase = "../../testdata/lfm25-detok-tiny/detok_T7.safetensors"

func readF32(t *testing.T, path, name string) ([]float32, []int) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tt, err := f.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tt.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	return v, tt.Shape
}

// TestDecode: decode turns a reference case's codes into its waveform with
// the tiny LFM2.5 folder's detokenizer, whole or streamed in chunks (the
// same samples), dumping the intermediates under the fixture's names.
func TestDecode(t *testing.T) {
	model := testmodel.LFM25Tiny(t, true)
	dir := t.TempDir()
	dec := func(name string, extra ...string) (wav []float32, dump string) {
		out, dump := filepath.Join(dir, name+".wav"), filepath.Join(dir, name+".safetensors")
		args := append([]string{"decode", "--model", model, "--codes", detokCase, "--out", out, "--dump", dump, "--threads", "1"}, extra...)
		code, _, errOut := runCmd(t, "", args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		clip, err := audio.DecodeBytes(data, audio.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if clip.SampleRate != 24000 || len(clip.Samples) != 7*1920 {
			t.Errorf("%s: %d samples at %d Hz, want %d at 24000", name, len(clip.Samples), clip.SampleRate, 7*1920)
		}
		wav, _ = readF32(t, dump, "wav")
		return wav, dump
	}
	whole, dump := dec("whole")
	ref, _ := readF32(t, detokCase, "wav")
	var maxAbs float64
	for i := range ref {
		maxAbs = max(maxAbs, math.Abs(float64(whole[i]-ref[i])))
	}
	// stages/detok's fixture test explains the bound: 4× the reference's
	// own fp32 noise.
	if len(whole) != len(ref) || maxAbs > 4*3.05e-7 {
		t.Errorf("wav: %d samples, max abs %.3g from the reference", len(whole), maxAbs)
	}
	for _, c := range []struct {
		name  string
		shape []int
	}{{"emb_mean", []int{7, 64}}, {"lfm_hidden", []int{42, 64}}, {"lin_out", []int{42, 1282}}} {
		if _, shape := readF32(t, dump, c.name); !slices.Equal(shape, c.shape) {
			t.Errorf("%s shape %v, want %v", c.name, shape, c.shape)
		}
	}
	for _, n := range []string{"1", "2", "5"} {
		if got, _ := dec("chunk"+n, "--chunk", n); !slices.Equal(got, whole) {
			t.Errorf("--chunk %s: samples differ from the whole decode", n)
		}
	}
	// Mimi decodes the same codes to other speech, without intermediates.
	mimi, mdump := dec("mimi", "--codec", "mimi")
	if slices.Equal(mimi, whole) {
		t.Error("--codec mimi decoded like the detokenizer")
	}
	if f, err := safetensors.Open(mdump); err != nil {
		t.Fatal(err)
	} else {
		if f.Tensor("lin_out") != nil {
			t.Error("Mimi's dump has lin_out")
		}
		f.Close()
	}
}

func TestDecodeErrors(t *testing.T) {
	model := testmodel.LFM25Tiny(t, true)
	eoa := filepath.Join(t.TempDir(), "eoa.safetensors")
	f, err := os.Create(eoa)
	if err != nil {
		t.Fatal(err)
	}
	codes := make([]int64, 16)
	codes[1] = 2048 // frame 1 of codebook 0: end-of-audio
	if err := safetensors.Write(f, []*safetensors.Tensor{safetensors.NewI64("codes", codes, 8, 2)}, nil); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--model", model}, exitUsage, "--codes FILE is required"},
		{[]string{"--model", model, "--codes", detokCase, "--chunk", "-1"}, exitUsage, "--chunk -1"},
		{[]string{"--model", model, "--codes", eoa}, exitError, "end-of-audio"},
		{[]string{"--model", model, "--codes", "../../testdata/lfm25-detok-tiny/manifest.json"}, exitError, "manifest.json"},
	} {
		args := append([]string{"decode", "--out", ""}, tc.args...)
		code, _, errOut := runCmd(t, "", args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", args, code, errOut, tc.code, tc.want)
		}
	}
}
