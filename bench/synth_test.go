package bench_test

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/bench"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/tokenizer"
)

// The real-size layout must hold exactly the parameters of the reference
// model: liquid-audio v1.0.0's LFM2AudioModel(conf), built from
// LFM2-Audio-1.5B's config.json, has 1,453,505,664 (sum of p.numel() over
// its parameters, counted in the reference speed measurement that
// docs/performance.md compares against), and the released
// model.safetensors on Hugging Face (LiquidAI/LFM2-Audio-1.5B) is 2.94 GB,
// with the tied depth heads materialised.
func TestRealLayout(t *testing.T) {
	c := bench.Real()
	specs, err := c.ModelTensors()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := bench.Parameters(specs), int64(1_453_505_664); got != want {
		t.Errorf("parameters %d, want %d", got, want)
	}
	if got := bench.TotalBytes(specs); math.Round(float64(got)/1e7) != 294 {
		t.Errorf("model.safetensors data %d bytes, want 2.94 GB", got)
	}
	for _, part := range []struct {
		prefix string
		want   int64
	}{
		// LFM2-1.2B's 1.17 B; the rest as liquid-audio's modules count
		// at these sizes (the conformer is canary-180m-flash's encoder).
		{"lfm.", 1_170_340_608},
		{"depthformer.", 67_645_824},      // 6 × 1024: 67.6 M
		{"depth_linear.", 16_785_408},     // 2048 → 8 × 1024 with bias: 16.8 M
		{"audio_adapter.", 5_248_000},     // 512 → 2048 → 2048: 5.2 M
		{"conformer.", 109_548_544},       // 17 × 512: ≈ 0.11 B
		{"depth_embeddings.", 16_793_600}, // 8 × (2049 × 1024 + a 1024 norm): 16.8 M (tied heads not counted)
	} {
		if got := bench.Parameters(bench.WithPrefix(specs, part.prefix)); got != part.want {
			t.Errorf("%s: %d parameters, want %d", part.prefix, got, part.want)
		}
	}
}

// ConfigJSON must read back, through the loader's parser, as the config it
// was written from.
func TestConfigRoundTrip(t *testing.T) {
	for name, c := range map[string]bench.Checkpoint{"real": bench.Real(), "tiny": bench.Tiny()} {
		t.Run(name, func(t *testing.T) {
			data, err := c.ConfigJSON()
			if err != nil {
				t.Fatal(err)
			}
			got, err := config.ParseAudio(data)
			if err != nil {
				t.Fatal(err)
			}
			want := c.Config
			if err := want.Validate(); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("config.json reads back as\n%+v\nwant\n%+v", *got, want)
			}
			if !bytes.Contains(data, []byte(`"block_ffn_dim_multiplier": 1`)) {
				t.Errorf("config.json lacks block_ffn_dim_multiplier: %s", data)
			}
		})
	}
}

func TestTokenizerJSON(t *testing.T) {
	for _, vocab := range []int{392, 512, 65536} {
		data, err := bench.TokenizerJSON(vocab)
		if err != nil {
			t.Fatalf("vocab %d: %v", vocab, err)
		}
		tok, err := tokenizer.Parse(data)
		if err != nil {
			t.Fatalf("vocab %d: %v", vocab, err)
		}
		if tok.VocabSize() != vocab {
			t.Errorf("vocab %d: tokenizer has %d ids", vocab, tok.VocabSize())
		}
		for id, s := range map[int]string{0: "<|pad|>", 1: "<|startoftext|>", 6: "<|im_start|>", 7: "<|im_end|>",
			128: "<|audio_start|>", 129: "<|text_start|>", 130: "<|text_end|>", 77: "<|reserved_77|>"} {
			if got, ok := tok.TokenID(s); !ok || got != id || !tok.IsSpecial(id) {
				t.Errorf("vocab %d: %s has id %d (found %v, special %v), want %d", vocab, s, got, ok, tok.IsSpecial(id), id)
			}
		}
		text := "Hello World, the café is open!"
		ids := tok.Encode(text)
		if got := tok.Decode(ids); got != text {
			t.Errorf("vocab %d: %q encodes to %v, decodes to %q", vocab, text, ids, got)
		}
		// Merged tokens exist and are used once the vocabulary has room.
		if vocab == 65536 && len(ids) >= len(text) {
			t.Errorf("vocab %d: %q took %d tokens, no merges applied", vocab, text, len(ids))
		}
		// The last id is a merged token (a byte token when there is no room
		// for merges: a lone byte may not be UTF-8).
		if got := tok.Decode([]int{vocab - 1}); vocab > 392 && (got == "" || strings.ContainsRune(got, '\uFFFD')) {
			t.Errorf("vocab %d: the last id decodes to %q", vocab, got)
		}
	}
	if _, err := bench.TokenizerJSON(391); err == nil {
		t.Error("a vocabulary without room for the byte tokens was accepted")
	}
}

// A tensor's values depend only on the seed and its name, the file parses,
// and the in-memory and on-disk writers agree.
func TestSafetensors(t *testing.T) {
	c := bench.Tiny()
	specs, err := c.ModelTensors()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := bench.Safetensors(specs, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	part := bench.WithPrefix(specs, "lfm.layers.1.", "codebook_offsets")
	sub, err := bench.Safetensors(part, 7, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := safetensors.Parse(whole, "whole")
	if err != nil {
		t.Fatal(err)
	}
	fs, err := safetensors.Parse(sub, "sub")
	if err != nil {
		t.Fatal(err)
	}
	if len(fw.Names()) != len(specs) || len(fs.Names()) != len(part) || fs.Metadata["k"] != "v" {
		t.Fatalf("files hold %d and %d tensors, want %d and %d", len(fw.Names()), len(fs.Names()), len(specs), len(part))
	}
	for _, s := range part {
		a, b := fw.Tensor(s.Name), fs.Tensor(s.Name)
		if a == nil || b == nil || !bytes.Equal(a.Data, b.Data) || !reflect.DeepEqual(a.Shape, b.Shape) {
			t.Errorf("%s differs between the whole file and a subset", s.Name)
		}
	}
	offs, err := fw.Tensor("codebook_offsets").Int64s()
	if err != nil || len(offs) != 8 || offs[3] != 3*2049 {
		t.Errorf("codebook_offsets = %v (%v)", offs, err)
	}
	other, err := bench.Safetensors(part, 8, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(other, sub) {
		t.Error("seeds 7 and 8 gave the same tensors")
	}

	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := bench.WriteSafetensors(path, specs, 7, nil); err != nil {
		t.Fatal(err)
	}
	disk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(disk, whole) {
		t.Error("WriteSafetensors and Safetensors differ")
	}
}

// The drawn values follow their distributions: a 2²⁰-value N(0, σ²) tensor's
// sample mean and deviation are within 6 standard errors (σ/√n for the
// mean, σ/√(2n) for the deviation, about 0.1% of σ) plus bf16's relative
// rounding of 2⁻⁹, which averages out; a uniform's bounds hold.
func TestDistributions(t *testing.T) {
	const n = 1 << 20
	specs := []bench.TensorSpec{
		{Name: "n", Shape: []int{n}, DType: safetensors.BF16, Init: bench.Init{Dist: bench.Normal, A: 0, B: 0.02}},
		{Name: "one", Shape: []int{n}, DType: safetensors.F32, Init: bench.Init{Dist: bench.Normal, A: 1, B: 0.1}},
		{Name: "u", Shape: []int{n}, DType: safetensors.F32, Init: bench.Init{Dist: bench.Uniform, A: 0.5, B: 2}},
		{Name: "ln", Shape: []int{n}, DType: safetensors.F32, Init: bench.Init{Dist: bench.LogNormal, A: 0, B: 0.2}},
	}
	data, err := bench.Safetensors(specs, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Parse(data, "d")
	if err != nil {
		t.Fatal(err)
	}
	moments := func(name string) (mean, std, lo, hi float64) {
		v, err := f.Tensor(name).Float64s()
		if err != nil {
			t.Fatal(err)
		}
		lo, hi = math.Inf(1), math.Inf(-1)
		for _, x := range v {
			mean += x
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
		mean /= float64(len(v))
		for _, x := range v {
			std += (x - mean) * (x - mean)
		}
		return mean, math.Sqrt(std / float64(len(v)-1)), lo, hi
	}
	for _, c := range []struct {
		name      string
		mean, std float64
	}{
		{"n", 0, 0.02},
		{"one", 1, 0.1},
		{"u", 1.25, 1.5 / math.Sqrt(12)},
		{"ln", math.Exp(0.02), math.Sqrt((math.Exp(0.04) - 1) * math.Exp(0.04))},
	} {
		mean, std, lo, hi := moments(c.name)
		t.Logf("%s: mean %.6g (want %.6g), std %.6g (want %.6g), range [%.4g, %.4g]", c.name, mean, c.mean, std, c.std, lo, hi)
		se := c.std / math.Sqrt(n)
		if math.Abs(mean-c.mean) > 6*se+math.Abs(c.mean)*1e-4 {
			t.Errorf("%s: mean %g, want %g ± %g", c.name, mean, c.mean, 6*se)
		}
		if math.Abs(std-c.std) > 6*c.std/math.Sqrt(2*n)+c.std*2e-3 {
			t.Errorf("%s: std %g, want %g", c.name, std, c.std)
		}
		if c.name == "u" && (lo < 0.5 || hi >= 2) {
			t.Errorf("uniform values in [%g, %g], want [0.5, 2)", lo, hi)
		}
	}
}

// The tiny synthetic checkpoint loads through the strict loader (from
// memory and from a folder) and runs measured turns.
func TestTinyCheckpointRuns(t *testing.T) {
	c := bench.Tiny()
	fsys, err := c.FS()
	if err != nil {
		t.Fatal(err)
	}
	dev := cpu.New(2)
	defer dev.Close()
	m, err := lfm2audio.LoadFS(dev, fsys, "tiny-synthetic")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	specs, _ := c.ModelTensors()
	byName := map[string]bench.TensorSpec{}
	for _, s := range specs {
		byName[s.Name] = s
	}
	for _, n := range m.Bound {
		if _, ok := byName[n]; !ok {
			t.Errorf("the loader bound %q, which the builder did not write", n)
		}
	}

	// The loop's weight bytes, counted from the specs.
	var want bench.WeightBytes
	for _, s := range specs {
		switch {
		case s.Name == "lfm.embed_tokens.weight":
			want.TextHead += s.Bytes()
		case strings.HasPrefix(s.Name, "lfm."):
			want.Backbone += s.Bytes()
		case strings.HasPrefix(s.Name, "depth_linear."):
			want.DepthFrame += s.Bytes()
		case strings.HasPrefix(s.Name, "depthformer."):
			want.DepthFrame += int64(c.Config.Codebooks) * s.Bytes()
		case strings.HasPrefix(s.Name, "depth_embeddings.") && !strings.HasSuffix(s.Name, "to_logits.weight"):
			want.DepthFrame += s.Bytes() // tied: the embedding is the head
		}
	}
	if got := bench.ModelWeightBytes(m); got != want {
		t.Errorf("loop weight bytes %+v, want %+v", got, want)
	}

	clip, err := bench.SpeechClip(1.2, 24000, 1)
	if err != nil {
		t.Fatal(err)
	}
	bw := bench.Bandwidth{CopyGBs: 10, ReadGBs: 20, Threads: 2}
	const steps = 30 // 6 text, 12 audio, 6 text, 6 audio
	rep, err := bench.Run(context.Background(), m, dev, bench.Options{
		Clip: clip, ClipSource: "synthetic", Turns: 2, MaxNewTokens: steps,
		AudioSampling: pipeline.DefaultAudio, Seed: 5, Bandwidth: &bw,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Turns) != 2 {
		t.Fatalf("%d turns reported, want 2", len(rep.Turns))
	}
	for i, tr := range rep.Turns {
		if tr.Steps != steps || tr.TextSteps != 12 || tr.AudioSteps != 18 || tr.Frames != 18 || tr.DecodedFrames != 18 || tr.Stop != "max_tokens" {
			t.Errorf("turn %d: %+v; want %d steps (12 text, 18 audio), 18 frames decoded, stop max_tokens", i, tr, steps)
		}
	}
	wantN := map[string]int{bench.KeyLogMel: 2, bench.KeyEncoder: 2, bench.KeyPrefill: 2,
		bench.KeyTextStep: 22, bench.KeyAudioStep: 36, bench.KeyDepthFrame: 36}
	for key, n := range wantN {
		s, ok := rep.Stage(key)
		if !ok || s.N != n || !(s.Median > 0) || s.P90 < s.Median || s.Min > s.Median {
			t.Errorf("stage %s: %+v, want %d intervals with 0 < min ≤ median ≤ p90", key, s, n)
		}
	}
	if s, _ := rep.Stage(bench.KeyCodecCall); s.N < 2 || s.N > 36 {
		t.Errorf("codec calls %d, want 2 … 36 for 36 frames", s.N)
	}
	sum := rep.Summary
	if !(sum.LoopPerFrame > 0 && sum.GenerationPerFrame > 0 && sum.FirstText > 0 && sum.FirstAudio >= sum.FirstText && sum.RTF > 0) {
		t.Errorf("summary %+v", sum)
	}
	if sum.CodecOverlapBackbone < 0 || sum.CodecOverlapBackbone > sum.CodecOverlapLoop || sum.CodecOverlapLoop > 1+1e-9 {
		t.Errorf("codec overlap %g (backbone) %g (loop), want 0 ≤ backbone ≤ loop ≤ 1", sum.CodecOverlapBackbone, sum.CodecOverlapLoop)
	}
	wb := rep.Model.Weights
	if f := rep.Floors.AudioFrame; math.Abs(f-float64(wb.AudioFrame())/10e9*1000) > 1e-9 {
		t.Errorf("audio-frame floor %g ms, want %d bytes at 10 GB/s", f, wb.AudioFrame())
	}
	if rep.Model.Family != "lfm2-audio" || rep.Model.Codec != "mimi" {
		t.Errorf("report's family %q codec %q, want lfm2-audio mimi", rep.Model.Family, rep.Model.Codec)
	}
	var out bytes.Buffer
	if err := rep.Print(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())

	// The same checkpoint written to a folder loads memory-mapped.
	dir := t.TempDir()
	if err := c.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	m2, err := lfm2audio.Load(dev, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if m2.Params != m.Params {
		t.Errorf("loaded from a folder: %d parameters, from memory %d", m2.Params, m.Params)
	}
}

// A stop the model picks ends the turn when stops are allowed: with the
// EOS logit of a tiny model the turn ends early or at the limit, and
// suppression never happens.
func TestAllowStop(t *testing.T) {
	c := bench.Tiny()
	fsys, err := c.FS()
	if err != nil {
		t.Fatal(err)
	}
	dev := cpu.New(2)
	defer dev.Close()
	m, err := lfm2audio.LoadFS(dev, fsys, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	clip, _ := bench.SpeechClip(0.5, 16000, 2)
	bw := bench.Bandwidth{CopyGBs: 1, ReadGBs: 1}
	rep, err := bench.Run(context.Background(), m, dev, bench.Options{Clip: clip, MaxNewTokens: 12, AllowStop: true, Bandwidth: &bw})
	if err != nil {
		t.Fatal(err)
	}
	if tr := rep.Turns[0]; tr.Steps > 12 {
		t.Errorf("turn %+v: stops allowed, want at most 12 steps", tr)
	}
}

func TestSpeechClip(t *testing.T) {
	a, err := bench.SpeechClip(2, 16000, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := bench.SpeechClip(2, 16000, 1)
	c, _ := bench.SpeechClip(2, 16000, 2)
	if len(a.Samples) != 32000 || a.SampleRate != 16000 {
		t.Fatalf("%d samples at %d Hz, want 32000 at 16000", len(a.Samples), a.SampleRate)
	}
	if !reflect.DeepEqual(a, b) || reflect.DeepEqual(a, c) {
		t.Error("the clip is not a function of its seed")
	}
	var peak, energy float64
	silent := 0
	for _, v := range a.Samples {
		peak = math.Max(peak, math.Abs(float64(v)))
		energy += float64(v) * float64(v)
		if math.Abs(float64(v)) < 0.01 {
			silent++
		}
	}
	rms := math.Sqrt(energy / float64(len(a.Samples)))
	t.Logf("peak %.3f, rms %.3f, %.0f%% of samples below 0.01", peak, rms, 100*float64(silent)/float64(len(a.Samples)))
	// Peak 0.5 plus at most a few noise-floor deviations (σ 1e-3).
	if peak < 0.49 || peak > 0.51 || rms < 0.03 {
		t.Errorf("peak %g, rms %g: want a peak of 0.5 and speech-like energy", peak, rms)
	}
	for _, bad := range []struct {
		s    float64
		rate int
	}{{0, 16000}, {-1, 16000}, {math.NaN(), 16000}, {1, 100}} {
		if _, err := bench.SpeechClip(bad.s, bad.rate, 1); err == nil {
			t.Errorf("SpeechClip(%v, %d) gave no error", bad.s, bad.rate)
		}
	}
}

func TestMeasureBandwidth(t *testing.T) {
	bw := bench.MeasureBandwidth(2)
	t.Logf("%+v", bw)
	if !(bw.CopyGBs > 0) || !(bw.ReadGBs > 0) || bw.Threads != 2 || bw.Bytes <= 0 {
		t.Errorf("bandwidth %+v", bw)
	}
}

// The depthformer's vocabulary and end-of-audio follow the codec's
// codebook size (its quantizer's bins), not a constant: a checkpoint whose
// codec has 1000 codes per codebook loads with end-of-audio 1000 and
// 1001-entry codebook tables, and its turns run and decode (every code the
// depthformer picks is one the codec holds, or end-of-audio).
func TestCodebookSizeFromCodec(t *testing.T) {
	dev := cpu.New(2)
	defer dev.Close()
	clip, err := bench.SpeechClip(0.5, 16000, 3)
	if err != nil {
		t.Fatal(err)
	}
	bw := bench.Bandwidth{CopyGBs: 1, ReadGBs: 1}
	for _, bins := range []int{2048, 1000} {
		t.Run(strconv.Itoa(bins), func(t *testing.T) {
			c := bench.Tiny()
			c.Mimi.Quantizer.Bins = bins
			fsys, err := c.FS()
			if err != nil {
				t.Fatal(err)
			}
			m, err := lfm2audio.LoadFS(dev, fsys, "tiny")
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			CB := c.Config.Codebooks
			if m.Special.EOA != bins || m.Depth.Vocab != bins+1 || m.AudioEmb.Rows != CB*(bins+1) {
				t.Errorf("end-of-audio %d, depthformer vocabulary %d, audio embedding %d rows; want %d, %d, %d",
					m.Special.EOA, m.Depth.Vocab, m.AudioEmb.Rows, bins, bins+1, CB*(bins+1))
			}
			for i, e := range m.Depth.Emb {
				if e.Rows != bins+1 || m.Depth.ToLogits[i].Rows != bins+1 {
					t.Errorf("codebook %d: tables of %d and %d rows, want %d", i, e.Rows, m.Depth.ToLogits[i].Rows, bins+1)
				}
			}
			st, err := safetensors.Parse(fsys[bench.ModelFile].Data, "model")
			if err != nil {
				t.Fatal(err)
			}
			offs, err := st.Tensor("codebook_offsets").Int64s()
			if err != nil || len(offs) != CB || offs[3] != int64(3*(bins+1)) {
				t.Errorf("codebook_offsets = %v (%v), want multiples of %d", offs, err, bins+1)
			}
			rep, err := bench.Run(context.Background(), m, dev, bench.Options{
				Clip: clip, MaxNewTokens: 14, AudioSampling: pipeline.DefaultAudio, Seed: 3, Bandwidth: &bw,
			})
			if err != nil {
				t.Fatal(err)
			}
			if tr := rep.Turns[0]; tr.Frames != 8 || tr.DecodedFrames != 8 {
				t.Errorf("turn %+v: want 8 frames sampled and decoded", tr)
			}
		})
	}
}

// A codec whose codebook size disagrees with the depthformer's tables
// fails to load, saying so.
func TestCodebookSizeMismatch(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	c := bench.Tiny()
	fsys, err := c.FS()
	if err != nil {
		t.Fatal(err)
	}
	other := bench.Tiny()
	other.Mimi.Quantizer.Bins = 1000
	ofs, err := other.FS()
	if err != nil {
		t.Fatal(err)
	}
	fsys[bench.CodecFile], fsys[bench.CodecConfigFile] = ofs[bench.CodecFile], ofs[bench.CodecConfigFile]
	m, err := lfm2audio.LoadFS(dev, fsys, "tiny")
	if err == nil {
		m.Close()
		t.Fatal("a codec of 1000 codes loaded with depthformer tables of 2049")
	}
	for _, want := range []string{"1000", "2049", "end-of-audio"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want one naming %q", err, want)
		}
	}
	t.Log(err)
}
