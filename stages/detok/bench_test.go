package detok

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
)

// realConfig is LFM2.5-Audio-1.5B's detokenizer configuration (hidden 512,
// 8 layers, three of them sliding-window attention).
const realConfig = `{"model_type": "lfm2", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 16,
"num_key_value_heads": 8, "intermediate_size": 3328, "block_ff_dim": 3328, "block_auto_adjust_ff_dim": true,
"block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "norm_eps": 1e-5, "conv_L_cache": 3, "conv_bias": false,
"rope_theta": 1000000.0, "max_position_embeddings": 128000, "sliding_window": 30, "output_size": 1282,
"vocab_size": 65536, "layer_types": ["conv", "conv", "sliding_attention", "conv", "sliding_attention", "conv",
"sliding_attention", "conv"]}`

// synthCheckpoint returns a random-weight bf16 checkpoint for cfg (the
// unused embed_tokens table zero).
func synthCheckpoint(tb testing.TB, cfg *Config) *safetensors.File {
	tb.Helper()
	r := rand.New(rand.NewPCG(7, 8))
	var ts []*safetensors.Tensor
	add := func(name string, scale float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]byte, 2*n)
		if scale != 0 {
			for i := range n {
				v := float32(scale * r.NormFloat64())
				if len(shape) == 1 && scale == 0.1 {
					v += 1 // norm weights
				}
				binary.LittleEndian.PutUint16(data[2*i:], uint16(math.Float32bits(v)>>16))
			}
		}
		ts = append(ts, &safetensors.Tensor{Name: name, DType: safetensors.BF16, Shape: shape, Data: data})
	}
	H, F, hd := cfg.HiddenSize, cfg.FFNDim(), cfg.HeadDim()
	kv := cfg.NumKeyValueHeads * hd
	add("emb.emb.weight", 1, Codebooks*2048, H)
	add("lfm.embed_tokens.weight", 0, cfg.VocabSize, H)
	add("lfm.embedding_norm.weight", 0.1, H)
	for i, k := range cfg.LayerTypes {
		p := fmt.Sprintf("lfm.layers.%d.", i)
		add(p+"operator_norm.weight", 0.1, H)
		add(p+"ffn_norm.weight", 0.1, H)
		add(p+"feed_forward.w1.weight", 1/math.Sqrt(float64(H)), F, H)
		add(p+"feed_forward.w3.weight", 1/math.Sqrt(float64(H)), F, H)
		add(p+"feed_forward.w2.weight", 1/math.Sqrt(float64(F)), H, F)
		if k == "conv" {
			add(p+"conv.in_proj.weight", 1/math.Sqrt(float64(H)), 3*H, H)
			add(p+"conv.conv.weight", 0.5, H, 1, cfg.ConvLCache)
			add(p+"conv.out_proj.weight", 1/math.Sqrt(float64(H)), H, H)
			continue
		}
		add(p+"self_attn.q_proj.weight", 1/math.Sqrt(float64(H)), H, H)
		add(p+"self_attn.k_proj.weight", 1/math.Sqrt(float64(H)), kv, H)
		add(p+"self_attn.v_proj.weight", 1/math.Sqrt(float64(H)), kv, H)
		add(p+"self_attn.out_proj.weight", 1/math.Sqrt(float64(H)), H, H)
		add(p+"self_attn.q_layernorm.weight", 0.1, hd)
		add(p+"self_attn.k_layernorm.weight", 0.1, hd)
	}
	add("lin.weight", 1/math.Sqrt(float64(H)), cfg.OutputSize, H)
	add("lin.bias", 0.05, cfg.OutputSize)
	// The periodic Hann window, bf16-rounded as the checkpoint stores it.
	n := cfg.NFFT()
	win := make([]byte, 2*n)
	for i := range n {
		v := float32(0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(n)))
		binary.LittleEndian.PutUint16(win[2*i:], gpu.F32ToBF16(v))
	}
	ts = append(ts, &safetensors.Tensor{Name: "istft.window", DType: safetensors.BF16, Shape: []int{n}, Data: win})
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, ts, nil); err != nil {
		tb.Fatal(err)
	}
	f, err := safetensors.Parse(buf.Bytes(), "synthetic detokenizer")
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// BenchmarkDecodeFrame is the real-size detokenizer's cost per 80 ms code
// frame, streamed one frame at a time (6 network rows, the head, 6
// inverse FFTs and the overlap-add).
func BenchmarkDecodeFrame(b *testing.B) {
	cfg, err := ParseConfig([]byte(realConfig))
	if err != nil {
		b.Fatal(err)
	}
	f := synthCheckpoint(b, cfg)
	r := rand.New(rand.NewPCG(3, 4))
	codes := make([][]int, 64)
	for i := range codes {
		codes[i] = make([]int, Codebooks)
		for k := range codes[i] {
			codes[i][k] = r.IntN(2048)
		}
	}
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			dev := cpu.New(workers)
			defer dev.Close()
			d, err := New(dev, f, *cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			s := d.NewStream()
			defer s.Close()
			var out []float32
			for i := range 40 { // past the window: the steady state
				if out, err = s.AppendDecode(out[:0], codes[i%64:i%64+1]); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if out, err = s.AppendDecode(out[:0], codes[i%64:i%64+1]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/80, "x_realtime")
		})
	}
}

// BenchmarkDecodeBatch decodes one frame of each of 1 or 4 streams per
// DecodeBatch call through the real-size detokenizer on a two-worker CPU
// device (the streams past the attention window: the steady state), and
// reports the cost per call and per stream's 80 ms frame: the batch shares
// the weights' reads of the per-row layers.
func BenchmarkDecodeBatch(b *testing.B) {
	cfg, err := ParseConfig([]byte(realConfig))
	if err != nil {
		b.Fatal(err)
	}
	f := synthCheckpoint(b, cfg)
	dev := cpu.New(2)
	defer dev.Close()
	d, err := New(dev, f, *cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	codes := randomCodes(rand.New(rand.NewPCG(3, 4)), 64, 2048)
	ctx := context.Background()
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			streams := make([]*Stream, n)
			for i := range streams {
				streams[i] = d.NewStream()
				defer streams[i].Close()
			}
			frames := make([][][]int, n)
			call := func(f int) {
				for i := range frames {
					frames[i] = codes[(f+7*i)%64 : (f+7*i)%64+1]
				}
				if _, err := d.DecodeBatch(ctx, streams, frames); err != nil {
					b.Fatal(err)
				}
			}
			for f := range 40 { // past the window: the steady state
				call(f)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				call(i)
			}
			b.StopTimer()
			ms := b.Elapsed().Seconds() * 1e3 / float64(b.N)
			b.ReportMetric(ms, "ms/call")
			b.ReportMetric(ms/float64(n), "ms/frame")
			b.ReportMetric(ms/float64(n)/80, "x-realtime")
		})
	}
}

// TestRealSizeLoads: the real-size configuration binds a checkpoint of
// its shapes and decodes (finite samples, 1920 per frame).
func TestRealSizeLoads(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 50 MB checkpoint")
	}
	cfg, err := ParseConfig([]byte(realConfig))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FFNDim() != 2304 || cfg.HeadDim() != 32 {
		t.Fatalf("FFN %d, head dim %d; want 2304, 32", cfg.FFNDim(), cfg.HeadDim())
	}
	dev := cpu.New(2)
	defer dev.Close()
	d, err := New(dev, synthCheckpoint(t, cfg), *cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pcm, err := d.Decode([][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {2047, 2047, 2047, 2047, 2047, 2047, 2047, 2047}})
	if err != nil {
		t.Fatal(err)
	}
	if len(pcm) != 3840 {
		t.Fatalf("%d samples", len(pcm))
	}
	for i, v := range pcm {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("sample %d is %v", i, v)
		}
	}
}
