package parity

import (
	"fmt"
	"slices"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/internal/numcmp"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/stages/lfm2"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// A stageRun is the backbone and the heads replaying the file's own turn
// on the reference's own prompt: its text ids, its audio-out codes and its
// adapter_out rows at the audio-in positions, the whole conversation
// prefilled at once as the reference does, then every step teacher-forced
// with the reference's trace.
//
// The engine's replay feeds the backbone its own front end's rows instead.
// Those cannot carry the reference's rounding: the reference's float32 STFT
// moves 14–100 of its bf16 mel values by an ulp, and one such ulp in one
// mel value moves the conformer's output as far as all of the reference's
// bf16 noise does (relative L2 0.005 on the fixtures). From the backbone
// on, the engine's BF16 run is then an independent noise sample, no closer
// to the reference than the F32 run, and rules that ask it to be are coin
// flips. Fed the reference's own rows, the BF16 backbone and depthformer
// reproduce the reference bit for bit almost everywhere, and the rules of
// rules.go test exactly that.
type stageRun struct {
	prefill       []float32 // [N, hidden]
	prefillLogits []float32 // [vocab], the last row's
	hidden        []float32 // [steps, hidden]: the row each step sampled from
	tokens        []int     // our greedy text token per step (−1 on audio steps)
	codes         []int     // our greedy codes [steps, codebooks] (−1 on text steps)
	textLogits    map[int][]float32
	audioLogits   map[[2]int][]float32 // by (step, codebook)
}

// runStages replays the reference's turn at the stage level in precision p.
func runStages(m *lfm2audio.Model, dev gpu.Device, ref *refcase.Case, p nn.Precision) (*stageRun, error) {
	mod, err := ref.Ints("prompt_modality")
	if err != nil {
		return nil, err
	}
	ids, err := ref.Ints("prompt_text_ids")
	if err != nil {
		return nil, err
	}
	tr, err := ref.Trace("")
	if err != nil {
		return nil, err
	}
	H, CB := m.Cfg.LFM.HiddenSize, m.Cfg.Codebooks
	var adapter []float32
	if ref.Has("adapter_out") {
		if adapter, err = ref.Floats("adapter_out"); err != nil {
			return nil, err
		}
	}
	var audioOut []int
	nOut := 0
	if ref.Has("prompt_audio_out") {
		audioOut, _ = ref.Ints("prompt_audio_out") // [codebooks, n]
		nOut = len(audioOut) / CB
	}
	c := nn.NewCtx(dev, dev.NewQueue("parity-stages"), p)
	defer c.A.Free()
	cache := m.Backbone.NewCache(dev)
	defer cache.Free()

	// The prompt rows, as liquid-audio's _prefill assembles them.
	x := c.Tmp(len(mod), H)
	ti, ai, oi := 0, 0, 0
	for r, md := range mod {
		switch md {
		case 1:
			if ti >= len(ids) {
				return nil, fmt.Errorf("prompt: more text rows than its %d ids", len(ids))
			}
			m.Backbone.EmbedTokens(c, x.Row(r), []int32{int32(ids[ti])})
			ti++
		case 2:
			if (ai+1)*H > len(adapter) {
				return nil, fmt.Errorf("prompt: more audio-in rows than adapter_out holds (%d)", len(adapter)/H)
			}
			c.Q.Write(x.Row(r), adapter[ai*H:(ai+1)*H])
			ai++
		case 3:
			if oi >= nOut {
				return nil, fmt.Errorf("prompt: more audio-out rows than its %d frames", nOut)
			}
			frame := make([]int, CB)
			for i := range frame {
				frame[i] = audioOut[i*nOut+oi]
			}
			embedFrame(c, m, x.Row(r), frame)
			oi++
		default:
			return nil, fmt.Errorf("prompt: modality %d at row %d", md, r)
		}
	}
	if ti != len(ids) || ai*H != len(adapter) || oi != nOut {
		return nil, fmt.Errorf("prompt used %d of %d text ids, %d of %d adapter rows, %d of %d audio-out frames",
			ti, len(ids), ai, len(adapter)/H, oi, nOut)
	}
	h := m.Backbone.Forward(c, x, []lfm2.Seq{{Cache: cache, Rows: x.Rows}})
	run := &stageRun{textLogits: map[int][]float32{}, audioLogits: map[[2]int][]float32{}}
	if run.prefill, err = read(c, h); err != nil {
		return nil, err
	}
	row := c.Tmp(1, H)
	c.Q.Copy(row, h.Row(h.Rows-1))
	logits := c.Tmp(1, m.Cfg.LFM.VocabSize)
	S := tr.Steps()
	run.tokens, run.codes = make([]int, S), slices.Repeat([]int{-1}, S*CB)
	for s := range S {
		mark := c.A.Mark()
		if s > 0 {
			// The reference's pick of step s−1 is the input of step s.
			in := c.Tmp(1, H)
			if tr.Modality[s-1] == 1 {
				m.Backbone.EmbedTokens(c, in, []int32{int32(tr.Tokens[s-1])})
			} else {
				embedFrame(c, m, in, tr.Codes[s-1])
			}
			out := m.Backbone.Forward(c, in, []lfm2.Seq{{Cache: cache, Rows: 1}})
			c.Q.Copy(row, out)
		}
		hv, err := read(c, row)
		if err != nil {
			return nil, err
		}
		run.hidden = append(run.hidden, hv...)
		run.tokens[s] = -1
		switch tr.Modality[s] {
		case 1:
			m.Backbone.Logits(c, logits, row)
			l, err := read(c, logits)
			if err != nil {
				return nil, err
			}
			if s == 0 {
				run.prefillLogits = l
			}
			run.tokens[s], run.textLogits[s] = numcmp.Argmax(l), l
		case 3:
			_, err := m.Depth.Frame(c, row, func(_, i int, l []float32) int {
				run.codes[s*CB+i] = numcmp.Argmax(l)
				run.audioLogits[[2]int{s, i}] = slices.Clone(l)
				return tr.Codes[s][i] // teacher-forced within the frame
			})
			if err != nil {
				return nil, fmt.Errorf("step %d: %w", s, err)
			}
		default:
			return nil, fmt.Errorf("step %d: modality %d", s, tr.Modality[s])
		}
		c.A.Release(mark)
	}
	if run.prefillLogits == nil { // a turn that starts with audio
		m.Backbone.Logits(c, logits, h.Row(h.Rows-1))
		if run.prefillLogits, err = read(c, logits); err != nil {
			return nil, err
		}
	}
	return run, nil
}

// embedFrame writes the audio feedback of a frame: the sum of its codes'
// embeddings (codebook i offset by i·m.Depth.Vocab), rounded as the
// reference's bf16 sum.
func embedFrame(c *nn.Ctx, m *lfm2audio.Model, dst gpu.Tensor, codes []int) {
	ids := make([]int32, len(codes))
	for i, code := range codes {
		ids[i] = int32(code + i*m.Depth.Vocab)
	}
	c.Q.Embed(dst, m.AudioEmb, ids)
	c.Round(dst)
}

func read(c *nn.Ctx, t gpu.Tensor) ([]float32, error) {
	v := make([]float32, t.Len())
	if err := c.Q.Read(v, t); err != nil {
		return nil, err
	}
	return v, nil
}
