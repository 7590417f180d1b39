package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

const tiny = "../../testdata/lfm2-audio-tiny"

func runCmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &env{stdin: strings.NewReader(stdin), stdout: &o, stderr: &e, getenv: func(string) string { return "" }})
	return code, o.String(), e.String()
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "usage: omni-pipe COMMAND"},
		{[]string{"help"}, exitOK, "commands:"},
		{[]string{"bogus"}, exitUsage, `unknown command "bogus"`},
		{[]string{"version"}, exitOK, "omni-pipe "},
		{[]string{"version", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"generate", "--no-such-flag"}, exitUsage, "flag provided but not defined"},
		{[]string{"generate", "--model", tiny}, exitUsage, "one of --wav, --text or --teacher is required"},
		{[]string{"generate", "--model", tiny, "--text", "hi", "--precision", "fp8"}, exitUsage, "unknown precision"},
		{[]string{"generate", "--model", tiny, "--text", "hi", "--device", "tpu"}, exitUsage, `device "tpu"`},
		{[]string{"generate", "--model", "/nonexistent", "--text", "hi"}, exitError, "config"},
		{[]string{"help", "generate"}, exitOK, "-max-new-tokens"},
		{[]string{"tokenize"}, exitUsage, "--model or --tokenizer"},
		{[]string{"parity", "--model", tiny}, exitUsage, "--reference is required"},
		{[]string{"mic", "--help"}, exitOK, ""},
	}
	for _, tt := range tests {
		code, out, errOut := runCmd(t, "", tt.args...)
		if code != tt.code || !strings.Contains(out+errOut, tt.want) {
			t.Errorf("omni-pipe %v: exit %d, output %q; want exit %d containing %q", tt.args, code, out+errOut, tt.code, tt.want)
		}
	}
}

func TestTokenize(t *testing.T) {
	code, out, errOut := runCmd(t, "What is the capital of France?", "tokenize", "--tokenizer", tiny+"/tokenizer.json", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	ref, err := refcase.Open(tiny + "/case3_text_only.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ids, _ := ref.Ints("prompt_text_ids")
	var got []int
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) == 0 {
		t.Fatalf("output %q: %v", out, err)
	}
	// The user text was tokenized as its own segment of the prompt: its ids
	// appear there contiguously.
	found := false
	for i := 0; i+len(got) <= len(ids); i++ {
		if slices.Equal(ids[i:i+len(got)], got) {
			found = true
		}
	}
	if !found {
		t.Errorf("ids %v are not a segment of the reference prompt %v", got, ids)
	}
}

// writeQuestionWAV writes the fixture's question clip (16 kHz int16 as
// loaded by the reference) as a WAV file.
func writeQuestionWAV(t *testing.T) string {
	ref, err := refcase.Open(tiny + "/case1_question_16k.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	clip, err := ref.Clip("input_wav")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "question.wav")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := audio.WriteWAV(f, clip.SampleRate, clip.Samples); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

// runGenerate runs `generate args… --out W --dump D` into a temporary
// folder and returns the reply WAV's bytes and the dump, open (closed when
// the test ends); a failing run fails the test.
func runGenerate(t *testing.T, args ...string) ([]byte, *safetensors.File) {
	t.Helper()
	dir := t.TempDir()
	out, dump := filepath.Join(dir, "reply.wav"), filepath.Join(dir, "dump.safetensors")
	args = append(append([]string{"generate"}, args...), "--out", out, "--dump", dump)
	if code, _, errOut := runCmd(t, "", args...); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(dump)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return data, f
}

// checkReply requires a 24 kHz reply of 1920 samples for each of frames
// (> 0) decoded frames.
func checkReply(t *testing.T, name string, wav []byte, frames int) {
	t.Helper()
	clip, err := audio.DecodeBytes(wav, audio.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if clip.SampleRate != 24000 || len(clip.Samples) != 1920*frames || frames == 0 {
		t.Errorf("%s: %d samples at %d Hz for %d decoded frames", name, len(clip.Samples), clip.SampleRate, frames)
	}
}

// TestGenerate: a reply WAV of the right length; greedy runs and seeded
// sampled runs reproduce their files exactly.
func TestGenerate(t *testing.T) {
	wav := writeQuestionWAV(t)
	gen := func(name string, extra ...string) []byte {
		data, f := runGenerate(t, append([]string{"--model", tiny, "--wav", wav, "--max-new-tokens", "40"}, extra...)...)
		// The reply holds 1920 samples per decoded frame: every audio step
		// whose frame holds no end-of-audio code.
		codes, _ := f.Tensor("step_codes").Int64s()
		mods, _ := f.Tensor("step_modality").Int64s()
		frames := 0
		for s, m := range mods {
			if m != 3 {
				continue
			}
			ok := true
			for _, c := range codes[s*8 : s*8+8] {
				ok = ok && c != 2048
			}
			if ok {
				frames++
			}
		}
		checkReply(t, name, data, frames)
		return data
	}
	a, b := gen("greedy1", "--greedy"), gen("greedy2", "--greedy")
	if !bytes.Equal(a, b) {
		t.Error("two greedy runs wrote different WAVs")
	}
	c, d := gen("seed1", "--seed", "7"), gen("seed2", "--seed", "7")
	if !bytes.Equal(c, d) {
		t.Error("two sampled runs with the same seed wrote different WAVs")
	}
}

func TestParityCommand(t *testing.T) {
	code, out, errOut := runCmd(t, "", "parity", "--model", tiny, "--reference", tiny+"/case3_text_only.safetensors")
	if code != 0 || !strings.Contains(out, "PASS") {
		t.Errorf("parity: exit %d\n%s%s", code, out, errOut)
	}
}

// TestTokenizeEmpty: empty input is an empty list in every format, not
// JSON's null.
func TestTokenizeEmpty(t *testing.T) {
	tests := []struct {
		flag, want string
	}{
		{"--json", "[]\n"},
		{"--pieces", ""},
		{"", "\n"},
	}
	for _, tt := range tests {
		args := []string{"tokenize", "--tokenizer", tiny + "/tokenizer.json"}
		if tt.flag != "" {
			args = append(args, tt.flag)
		}
		code, out, errOut := runCmd(t, "", args...)
		if code != exitOK || out != tt.want {
			t.Errorf("tokenize %s on empty input: exit %d, stdout %q (stderr %q); want %q", tt.flag, code, out, errOut, tt.want)
		}
	}
}

// TestHelpAndBadFlags: `help help` is the general help; a bad flag is one
// line and a pointer to the command's help, not a page of usage; -h prints
// the usage on stdout.
func TestHelpAndBadFlags(t *testing.T) {
	code, out, errOut := runCmd(t, "", "help", "help")
	if code != exitOK || !strings.Contains(out, "commands:") || errOut != "" {
		t.Errorf("help help: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, args := range [][]string{
		{"generate", "--no-such-flag"},
		{"serve", "--max-queue", "many"},
		{"bench", "-x"},
	} {
		code, out, errOut := runCmd(t, "", args...)
		want := "omni-pipe " + args[0] + ": "
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if code != exitUsage || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], want) ||
			lines[1] != "run 'omni-pipe help "+args[0]+"' for usage" {
			t.Errorf("%v: exit %d, stdout %q, stderr:\n%s\nwant exit %d, the error and a pointer to help", args, code, out, errOut, exitUsage)
		}
	}
	code, out, errOut = runCmd(t, "", "generate", "-h")
	if code != exitOK || !strings.Contains(out, "usage: omni-pipe generate") || !strings.Contains(out, "-max-new-tokens") || errOut != "" {
		t.Errorf("generate -h: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestGenerateDemoModel: without --model, generate runs the embedded demo
// model (as serve and mic do), saying loudly what it is.
func TestGenerateDemoModel(t *testing.T) {
	out := filepath.Join(t.TempDir(), "reply.wav")
	code, _, errOut := runCmd(t, "", "generate", "--text", "hi", "--max-new-tokens", "30", "--greedy", "--out", out)
	if code != exitOK || !strings.Contains(errOut, "DEMO model") || !strings.Contains(errOut, "NOISE") {
		t.Fatalf("exit %d, stderr:\n%s\nwant 0 and the demo-model warning", code, errOut)
	}
	if _, err := os.Stat(out); err != nil {
		t.Error(err)
	}
	if code, _, errOut := runCmd(t, "", "generate", "--teacher", tiny+"/case3_text_only.safetensors"); code != exitUsage || !strings.Contains(errOut, "--teacher needs --model") {
		t.Errorf("--teacher without --model: exit %d, %q", code, errOut)
	}
}

// TestOutputCheckedFirst: an output file that cannot be written fails at
// once, before the model loads and the turn runs.
func TestOutputCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"generate", "--model", tiny, "--text", "hi", "--out", filepath.Join(missing, "reply.wav")}, "--out " + filepath.Join(missing, "reply.wav") + ": folder " + missing + " does not exist"},
		{[]string{"generate", "--model", tiny, "--text", "hi", "--out", dir}, "--out " + dir + ": is a folder"},
		{[]string{"generate", "--model", tiny, "--text", "hi", "--out", "", "--dump", filepath.Join(missing, "d.safetensors")}, "--dump " + filepath.Join(missing, "d.safetensors") + ": folder"},
		{[]string{"mic", "--model", tiny, "--wav", "x.wav", "--out", filepath.Join(missing, "o.wav")}, "--out " + filepath.Join(missing, "o.wav") + ": folder"},
		{[]string{"bench", "--model", tiny, "--cpuprofile", filepath.Join(missing, "cpu.prof")}, "--cpuprofile " + filepath.Join(missing, "cpu.prof") + ": folder"},
	} {
		code, out, errOut := runCmd(t, "", tc.args...)
		want := "omni-pipe " + tc.args[0] + ": " + tc.want
		if code != exitError || out != "" || !strings.HasPrefix(errOut, want) || strings.Contains(errOut, "msg=device") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d, nothing run, and %q", tc.args, code, out, errOut, exitError, want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the probe left files behind: %v", entries)
	}
}

// TestReadmeCommands: README's command table lists every command, and its
// first two commands are the ones the quick start promises.
func TestReadmeCommands(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `omni-pipe (\\w+)` \\|").FindAllStringSubmatch(readme, -1) {
		listed = append(listed, m[1])
	}
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(listed)
	slices.Sort(names)
	if !slices.Equal(listed, names) {
		t.Errorf("README's command table lists %v; the commands are %v", listed, names)
	}
	first := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(readme)
	if first == nil {
		t.Fatal("README has no sh block")
	}
	lines := strings.Split(strings.TrimSpace(first[1]), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "go run ./cmd/omni-pipe serve ") || !strings.HasPrefix(lines[1], "./scripts/test.sh ") {
		t.Errorf("README's first commands are %q, want `go run ./cmd/omni-pipe serve` and `./scripts/test.sh`", lines)
	}
	if _, err := os.Stat("../../scripts/test.sh"); err != nil {
		t.Error(err)
	}
}

// modelCopy makes a model folder of the fixture's files (linked) with
// config.json edited by the (from, to) pairs.
func modelCopy(t *testing.T, pairs ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"model.safetensors", "tokenizer.json", "mimi.safetensors", "mimi_config.json"} {
		abs, err := filepath.Abs(filepath.Join(tiny, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := os.ReadFile(filepath.Join(tiny, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(cfg)
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("config.json lacks %q", pairs[i])
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBadConfigFailsCheaply: a config.json with absurd sizes, or with sizes
// in bounds that its checkpoint does not have, fails to load with an error
// naming the problem, at once and without allocating what it asks for.
func TestBadConfigFailsCheaply(t *testing.T) {
	for _, tc := range []struct {
		from, to, want string
	}{
		{`"num_hidden_layers": 4`, `"num_hidden_layers": -1`, "lfm: num_hidden_layers = -1, want 1..1024"},
		{`"num_hidden_layers": 4`, `"num_hidden_layers": 1000000000`, "lfm: num_hidden_layers = 1000000000, want 1..1024"},
		{`"codebooks": 8`, `"codebooks": 1000000`, "codebooks = 1000000, want 1..64"},
		// In bounds, but not what model.safetensors holds.
		{`"num_hidden_layers": 4`, `"num_hidden_layers": 1024`, `missing tensor "lfm.layers.4.`},
		// The codec's configuration is checked first: it holds 8.
		{`"codebooks": 8`, `"codebooks": 64`, `decoding config.json's 64 codebooks: mimi config: num_codebooks_active = 64, want 2..8`},
		{`"codebooks": 8`, `"codebooks": 7`, `tensor "audio_embedding.embedding.weight" has shape [16392 24], want [14343 24]`},
		{`"vocab_size": 992`, `"vocab_size": 4194304`, `tensor "lfm.embed_tokens.weight" has shape [992 24], want [4194304 24]`},
	} {
		dir := modelCopy(t, tc.from, tc.to)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		code, _, errOut := runCmd(t, "", "generate", "--model", dir, "--text", "hi", "--out", "")
		runtime.ReadMemStats(&after)
		if code != exitError || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stderr %.600q; want exit %d and %q", tc.to, code, errOut, exitError, tc.want)
		}
		if n := strings.Count(errOut, "\n"); n > 30 {
			t.Errorf("%s: an error of %d lines", tc.to, n)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
			t.Errorf("%s: loading allocated %d MB before failing", tc.to, alloc>>20)
		}
	}
}
