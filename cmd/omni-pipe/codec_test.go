package main

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
)

// TestGenerateLFM25: generate runs a tiny LFM2.5-Audio folder end to end
// with the detokenizer by default (mapped or read into memory, the same
// WAV), and with --codec mimi the same codes decode to Mimi's different
// speech; the reply holds 1920 samples per decoded frame either way.
func TestGenerateLFM25(t *testing.T) {
	model := testmodel.LFM25Tiny(t, true)
	gen := func(name string, extra ...string) ([]byte, []int64) {
		data, f := runGenerate(t, append([]string{"--model", model, "--text", "Say hello.", "--greedy", "--max-new-tokens", "40", "--threads", "1"}, extra...)...)
		codes, err := f.Tensor("mimi_codes").Int64s()
		if err != nil {
			t.Fatal(err)
		}
		checkReply(t, name, data, len(codes)/8)
		return data, codes
	}
	det, codesD := gen("detokenizer")
	det2, _ := gen("detokenizer-explicit", "--codec", "detokenizer", "--no-mmap")
	mim, codesM := gen("mimi", "--codec", "mimi")
	if !bytes.Equal(det, det2) {
		t.Error("--codec detokenizer --no-mmap wrote another WAV than the default")
	}
	if !slices.Equal(codesD, codesM) {
		t.Error("the codec changed the generated codes")
	}
	if bytes.Equal(det, mim) {
		t.Error("--codec mimi wrote the detokenizer's WAV")
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--model", model, "--codec", "wavenet"}, exitUsage, `--codec "wavenet": want mimi or detokenizer`},
		{[]string{"--model", tiny, "--codec", "detokenizer"}, exitError, "no audio_detokenizer"},
		{[]string{"--codec", "detokenizer"}, exitUsage, "demo model has no detokenizer"},
	} {
		args := append([]string{"generate", "--text", "hi", "--max-new-tokens", "2", "--out", ""}, tc.args...)
		code, _, errOut := runCmd(t, "", args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestGenerateVoice: --voice us_male runs the prompt of --system "Perform
// TTS. Use the US male voice." --mode sequential (the same prompt tokens
// and the same greedy WAV); another voice is another prompt; an unknown
// voice is a usage error.
func TestGenerateVoice(t *testing.T) {
	model := testmodel.LFM25Tiny(t, true)
	gen := func(name string, extra ...string) (wav []byte, prompt []int64) {
		data, f := runGenerate(t, append([]string{"--model", model, "--text", "Hello there.", "--greedy", "--max-new-tokens", "40", "--threads", "1"}, extra...)...)
		ids, err := f.Tensor("prompt_text_ids").Int64s()
		if err != nil {
			t.Fatal(err)
		}
		return data, ids
	}
	v, pv := gen("voice", "--voice", "us_male")
	s, ps := gen("system", "--system", "Perform TTS. Use the US male voice.", "--mode", "sequential")
	if !slices.Equal(pv, ps) || !bytes.Equal(v, s) {
		t.Error("--voice us_male differs from its system prompt in sequential mode")
	}
	if _, pf := gen("female", "--voice", "uk_female"); slices.Equal(pf, pv) {
		t.Error("two voices gave the same prompt")
	}
	if _, pi := gen("interleaved"); slices.Equal(pi, pv) {
		t.Error("--voice gave the default prompt")
	}
	code, _, errOut := runCmd(t, "", "generate", "--model", model, "--text", "hi", "--voice", "alloy", "--out", "")
	if code != exitUsage || !strings.Contains(errOut, `--voice "alloy": want us_male, us_female, uk_male or uk_female`) {
		t.Errorf("--voice alloy: exit %d, %s", code, errOut)
	}
	// The voices are LFM2.5-Audio's: LFM2-Audio has none.
	code, _, errOut = runCmd(t, "", "generate", "--model", tiny, "--text", "hi", "--voice", "us_male", "--out", "")
	if code != exitUsage || !strings.Contains(errOut, `--voice "us_male": lfm2-audio has no preset voices`) {
		t.Errorf("LFM2-Audio --voice us_male: exit %d, %s", code, errOut)
	}
}

// TestBenchLFM25: bench runs the tiny LFM2.5 folder with the detokenizer,
// names the family and codec, and counts decoded frames by samples (the
// detokenizer's first frame comes short and its flush in a last event).
func TestBenchLFM25(t *testing.T) {
	model := testmodel.LFM25Tiny(t, true)
	code, out, errOut := runCmd(t, "", "bench", "--model", model, "--seconds", "1", "--turns", "1", "--warmup", "0", "--max-new-tokens", "24", "--greedy", "--json", "--threads", "1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	if rep.Model.Family != "lfm2.5-audio" || rep.Model.Codec != "detokenizer" {
		t.Errorf("family %q codec %q", rep.Model.Family, rep.Model.Codec)
	}
	if d := rep.Model.Defaults; d.SystemPrompts["interleaved"] != "Respond with interleaved text and audio." || len(d.Voices) != 4 {
		t.Errorf("defaults %+v: want the interleaved prompt and 4 voices", d)
	}
	if len(rep.Turns) != 1 || rep.Turns[0].DecodedFrames != 12 || math.Abs(rep.Turns[0].AudioSeconds-0.96) > 1e-9 {
		t.Errorf("turns %+v: want 12 decoded frames, 0.96 s", rep.Turns)
	}
}
