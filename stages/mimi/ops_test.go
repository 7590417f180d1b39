package mimi

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// opCounter is a queue that counts the ops it is given, by method: every
// method of gpu.Queue, and the batched ops of package gpu (CopyMany,
// CopyRows, AttentionSeqs) as one op each, as a backend that implements
// them runs them (one launch on CUDA). It runs them as their plain ops on
// the queue it wraps, uncounted.
type opCounter struct {
	gpu.Queue
	ops map[string]int
}

var (
	_ gpu.Copier      = (*opCounter)(nil)
	_ gpu.RowCopier   = (*opCounter)(nil)
	_ gpu.SeqAttender = (*opCounter)(nil)
)

func (c *opCounter) count(name string) { c.ops[name]++ }

func (c *opCounter) Name() string                        { c.count("Name"); return c.Queue.Name() }
func (c *opCounter) Write(dst gpu.Tensor, src []float32) { c.count("Write"); c.Queue.Write(dst, src) }
func (c *opCounter) WriteInt(dst gpu.Tensor, src []int32) {
	c.count("WriteInt")
	c.Queue.WriteInt(dst, src)
}
func (c *opCounter) Read(dst []float32, src gpu.Tensor) error {
	c.count("Read")
	return c.Queue.Read(dst, src)
}
func (c *opCounter) ReadInt(dst []int32, src gpu.Tensor) error {
	c.count("ReadInt")
	return c.Queue.ReadInt(dst, src)
}
func (c *opCounter) Copy(dst, src gpu.Tensor)       { c.count("Copy"); c.Queue.Copy(dst, src) }
func (c *opCounter) Fill(dst gpu.Tensor, v float32) { c.count("Fill"); c.Queue.Fill(dst, v) }
func (c *opCounter) Sync() error                    { c.count("Sync"); return c.Queue.Sync() }
func (c *opCounter) MatMul(dst, x, w, bias gpu.Tensor) {
	c.count("MatMul")
	c.Queue.MatMul(dst, x, w, bias)
}
func (c *opCounter) Add(dst, a, b gpu.Tensor)           { c.count("Add"); c.Queue.Add(dst, a, b) }
func (c *opCounter) Mul(dst, a, b gpu.Tensor)           { c.count("Mul"); c.Queue.Mul(dst, a, b) }
func (c *opCounter) AddRow(dst, a, v gpu.Tensor)        { c.count("AddRow"); c.Queue.AddRow(dst, a, v) }
func (c *opCounter) MulRow(dst, a, v gpu.Tensor)        { c.count("MulRow"); c.Queue.MulRow(dst, a, v) }
func (c *opCounter) Scale(dst, a gpu.Tensor, s float32) { c.count("Scale"); c.Queue.Scale(dst, a, s) }
func (c *opCounter) RoundBF16(dst gpu.Tensor)           { c.count("RoundBF16"); c.Queue.RoundBF16(dst) }
func (c *opCounter) Act(dst, a gpu.Tensor, f gpu.Activation) {
	c.count("Act")
	c.Queue.Act(dst, a, f)
}
func (c *opCounter) GLU(dst, a gpu.Tensor) { c.count("GLU"); c.Queue.GLU(dst, a) }
func (c *opCounter) RMSNorm(dst, a gpu.Tensor, eps float32) {
	c.count("RMSNorm")
	c.Queue.RMSNorm(dst, a, eps)
}
func (c *opCounter) LayerNorm(dst, a, w, b gpu.Tensor, eps float32) {
	c.count("LayerNorm")
	c.Queue.LayerNorm(dst, a, w, b, eps)
}
func (c *opCounter) Softmax(dst gpu.Tensor)                { c.count("Softmax"); c.Queue.Softmax(dst) }
func (c *opCounter) RoPE(dst gpu.Tensor, p gpu.RoPEParams) { c.count("RoPE"); c.Queue.RoPE(dst, p) }
func (c *opCounter) ShortConv(dst, x, w, state gpu.Tensor) {
	c.count("ShortConv")
	c.Queue.ShortConv(dst, x, w, state)
}
func (c *opCounter) Embed(dst, table gpu.Tensor, ids []int32) {
	c.count("Embed")
	c.Queue.Embed(dst, table, ids)
}
func (c *opCounter) EmbedIDs(dst, table, ids gpu.Tensor) {
	c.count("EmbedIDs")
	c.Queue.EmbedIDs(dst, table, ids)
}
func (c *opCounter) Transpose(dst, src gpu.Tensor) { c.count("Transpose"); c.Queue.Transpose(dst, src) }
func (c *opCounter) Attention(dst, q, k, v gpu.Tensor, p gpu.AttnParams) {
	c.count("Attention")
	c.Queue.Attention(dst, q, k, v, p)
}
func (c *opCounter) Sample(ids, logits gpu.Tensor, rows []gpu.SampleRow) {
	c.count("Sample")
	c.Queue.Sample(ids, logits, rows)
}
func (c *opCounter) Conv1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	c.count("Conv1D")
	c.Queue.Conv1D(dst, x, w, bias, p)
}
func (c *opCounter) ConvTranspose1D(dst, x, w, bias gpu.Tensor, p gpu.ConvParams) {
	c.count("ConvTranspose1D")
	c.Queue.ConvTranspose1D(dst, x, w, bias, p)
}
func (c *opCounter) Conv2D(dst, x, w, bias gpu.Tensor, p gpu.Conv2DParams) {
	c.count("Conv2D")
	c.Queue.Conv2D(dst, x, w, bias, p)
}
func (c *opCounter) CopyMany(pairs []gpu.CopyPair) {
	c.count("CopyMany")
	gpu.CopyMany(c.Queue, pairs)
}
func (c *opCounter) CopyRows(dst, src gpu.Tensor, dstRows, srcRows []int32) {
	c.count("CopyRows")
	gpu.CopyRows(c.Queue, dst, src, dstRows, srcRows)
}
func (c *opCounter) AttentionSeqs(dst, q gpu.Tensor, p gpu.AttnParams, seqs []gpu.AttnSeq) {
	c.count("AttentionSeqs")
	gpu.AttentionSeqs(c.Queue, dst, q, p, seqs)
}

// TestBatchOpsIndependentOfStreams: a batched decode frame gives the queue
// as many ops for 8 streams as for 2, frame after frame — from the first
// frames (replicate padding, growing caches) past the attention context
// and the caches' compaction — so that on a GPU (an op a launch) a frame
// of hundreds of streams costs the launches of one. The streams decode in
// lockstep, so that every stream's caches grow and compact in the same
// frame; a frame where only some streams compact differs by the
// compaction's one op, whatever the number of streams.
func TestBatchOpsIndependentOfStreams(t *testing.T) {
	const frames = 36 // past the tiny context's first compaction (64 rows)
	for _, tc := range testConfigs() {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newTestDecoder(t, tc.cfg, 11, tc.opts)
			oc := &opCounter{Queue: d.q}
			d.q = oc
			// frameOps decodes frames frames of n streams in lockstep and
			// returns each frame's ops by method.
			frameOps := func(n int) []map[string]int {
				rng := rand.New(rand.NewPCG(12, uint64(n)))
				streams := make([]*Stream, n)
				for i := range streams {
					streams[i] = d.NewStream()
					defer streams[i].Close()
				}
				var out []map[string]int
				for range frames {
					codes := make([][][]int, n)
					for i := range codes {
						codes[i] = randomCodes(rng, 1, tc.cfg.NumCodebooksActive, tc.cfg.Quantizer.Bins)
					}
					oc.ops = map[string]int{}
					if _, err := d.DecodeBatch(context.Background(), streams, codes); err != nil {
						t.Fatal(err)
					}
					out = append(out, oc.ops)
				}
				return out
			}
			two, eight := frameOps(2), frameOps(8)
			t.Logf("frame 0: %d ops for 2 streams, %d for 8; frame %d: %d, %d",
				sum(two[0]), sum(eight[0]), frames-1, sum(two[frames-1]), sum(eight[frames-1]))
			bad := 0
			for f := range frames {
				if diff := opsDiff(two[f], eight[f]); diff != "" {
					if bad++; bad <= 3 {
						t.Errorf("frame %d: %d ops for 2 streams, %d for 8 (%s)", f, sum(two[f]), sum(eight[f]), diff)
					}
				}
			}
			if bad > 3 {
				t.Errorf("… and %d more frames", bad-3)
			}
		})
	}
}

func sum(ops map[string]int) int {
	n := 0
	for _, v := range ops {
		n += v
	}
	return n
}

// opsDiff lists the methods whose counts differ between a and b.
func opsDiff(a, b map[string]int) string {
	names := maps.Clone(a)
	maps.Copy(names, b)
	var diff []string
	for _, k := range slices.Sorted(maps.Keys(names)) {
		if a[k] != b[k] {
			diff = append(diff, fmt.Sprintf("%s %d→%d", k, a[k], b[k]))
		}
	}
	return strings.Join(diff, ", ")
}
