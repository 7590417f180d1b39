// Package mimi decodes LFM2-Audio's audio codes to 24 kHz speech with
// Kyutai's Mimi codec (the decoder half of moshi's MimiModel), streamed.
//
// A frame is Codebooks() codes (one 80 ms step at 12.5 Hz). Decoding runs,
// in float32 throughout:
//
//	codes [T, 8] → split RVQ: rvq_first (codebook 0) and rvq_rest (1..7)
//	  lookups, each summed and projected by its output_proj, then added
//	→ ×2 transposed-conv upsample (depthwise)        [2T, 512] at 25 Hz
//	→ decoder transformer (causal, context 250, RoPE) [2T, 512]
//	→ SEANet decoder (causal convs, ×8 ×6 ×5 ×4)      [1920·T] samples
//
// A Decoder holds the weights; a Stream holds one utterance's state (the
// convolutions' past inputs, the transposed convolutions' pending
// contributions, the attention keys and values within the context) and
// decodes any number of frames per call. Every layer computes each output
// sample with the same float operations in the same order however the
// frames are split between calls, so decoding frame by frame gives exactly
// the samples of decoding everything at once. Decoder.DecodeBatch decodes
// several streams' next frames in the same passes, each stream's samples
// exactly those of its own calls.
//
// Attention follows moshi's whole-sequence decode (mimi.decode(codes)): a
// query at step p sees the keys at p−249 … p. moshi's streaming mode keeps
// keys in a ring of 250 entries that it fills before attending, so there
// the first of a frame's two steps sees only p−248 … p once an utterance
// passes 125 frames (10 s); the two official modes, and so this package and
// moshi's streamed output, differ from that point on.
//
// End-of-audio frames (any code equal to the codebook size, 2048) mark the
// end of speech and are never decoded: DecodeFrames refuses them with an
// error wrapping ErrEndOfAudio, as it refuses any code outside the
// codebooks, before touching the stream.
package mimi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// File names of the Mimi weights and configuration.
const (
	// OfficialWeightsName is the file LiquidAI/LFM2-Audio-1.5B (and
	// kyutai/moshiko-pytorch-bf16) ship.
	OfficialWeightsName = "tokenizer-e351c8d8-checkpoint125.safetensors"
	// WeightsName is the alternative name (the test fixtures use it).
	WeightsName = "mimi.safetensors"
	// ConfigName is the optional configuration next to the weights;
	// without it the official configuration applies.
	ConfigName = "mimi_config.json"
)

// ErrEndOfAudio reports a frame holding the end-of-audio code (the codebook
// size, 2048): such frames mark the end of speech and are never decoded.
var ErrEndOfAudio = errors.New("end-of-audio frame")

// defaultMaxChunk bounds the frames of a stream one pass decodes, and
// defaultMaxPass those of all the streams of a batch, so that a long whole
// decode or a large batch does not need memory in proportion to its length
// (about 11 MiB of scratch a frame at the official size; the results do
// not depend on either).
const (
	defaultMaxChunk = 16
	defaultMaxPass  = 32
	// gpuMaxPass is the most frames a pass takes on a GPU (about 1.4 GiB
	// of scratch): there a pass of many streams' frames costs little more
	// than one of a few, and at 256 sessions on an H200 passes of 32 frames
	// left the codec the engine's busiest stage (91 % of the run), a new
	// session's first frame waiting behind several passes.
	gpuMaxPass = 128
	// passFrameBytes is a pass's scratch a frame at the official size.
	passFrameBytes = 11 << 20
)

// maxPassFor is the frames one pass decodes on dev: gpuPass of its memory
// on a GPU, defaultMaxPass elsewhere; OMNIPIPE_MIMI_PASS=N (1–1024) sets
// it, to compare.
func maxPassFor(dev gpu.Device) int {
	if v, err := strconv.Atoi(os.Getenv("OMNIPIPE_MIMI_PASS")); err == nil && v >= 1 && v <= 1024 {
		return v
	}
	if in := gpu.DescribeDevice(dev); in.Kind == "cuda" {
		return gpuPass(in.MemTotal)
	}
	return defaultMaxPass
}

// gpuPass is a pass's frames on a GPU of mem bytes: as many as 1 % of its
// memory holds in scratch (the engine's memory budget leaves a tenth of
// the free memory to such arenas), between defaultMaxPass and gpuMaxPass:
// 128 on a 141 GB H200, 74 on an 80 GB card, 32 on a 24 GB one.
func gpuPass(mem int64) int {
	return int(min(max(mem/100/passFrameBytes, defaultMaxPass), gpuMaxPass))
}

// Decoder is a loaded Mimi decoder. It is safe for concurrent use: calls
// are serialised (the decoder has one scratch arena and one queue).
type Decoder struct {
	cfg      Config
	dev      gpu.Device
	q        gpu.Queue
	file     *safetensors.File // opened by Load, closed by Close
	owned    []gpu.Tensor
	states   []stateShape
	bins     int
	upStride int
	frameLen int // output samples per frame
	maxChunk int
	maxPass  int

	first, rest rvq
	up          *convTr // nil when the SEANet runs at the frame rate
	tr          *transformer
	dec         seanet

	mu      sync.Mutex
	arena   *nn.Arena
	batch   batch     // the pass's streams and scratch
	samples []float32 // scratch: a batched pass's samples
}

// rvq is one ResidualVectorQuantizer's decoding half.
type rvq struct {
	n     int        // codebooks decoded
	table gpu.Tensor // [n·bins, dim]: codebook i at rows i·bins …
	proj  gpu.Tensor // output_proj [outDim, dim]
}

type seanet struct {
	in     *conv1d
	stages []seanetStage
	out    *conv1d
}

type seanetStage struct {
	up  *convTr
	res []resBlock
}

// resBlock is SEANetResnetBlock: x + conv(elu(conv(elu(x)))), with an
// identity skip (true_skip) or a 1×1 convolution.
type resBlock struct {
	c1, c2 *conv1d
	skip   *conv1d // nil: identity
}

// Load loads a Mimi decoder onto dev from path: a weights file, or a
// directory holding OfficialWeightsName or WeightsName. A ConfigName file
// next to the weights overrides the official configuration.
func Load(dev gpu.Device, path string) (*Decoder, error) {
	file, err := weightsPath(path)
	if err != nil {
		return nil, err
	}
	cfg := DefaultConfig()
	cfgPath := filepath.Join(filepath.Dir(file), ConfigName)
	if _, err := os.Stat(cfgPath); err == nil {
		if cfg, err = LoadConfig(cfgPath); err != nil {
			return nil, fmt.Errorf("load mimi: %w", err)
		}
	}
	f, err := safetensors.Open(file)
	if err != nil {
		return nil, fmt.Errorf("load mimi: %w", err)
	}
	d, err := New(dev, f, cfg)
	if err != nil {
		f.Close()
		return nil, err
	}
	d.file = f
	return d, nil
}

func weightsPath(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("load mimi: %w", err)
	}
	if !st.IsDir() {
		return path, nil
	}
	for _, name := range []string{OfficialWeightsName, WeightsName} {
		p := filepath.Join(path, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("load mimi: %s holds neither %s nor %s", path, OfficialWeightsName, WeightsName)
}

// New binds a Mimi checkpoint (moshi state_dict names) for decoding. The
// encoder's tensors are recognised and skipped; a missing or mis-shaped
// tensor, or one the configuration does not explain, is an error naming
// it. The file must stay open while the Decoder is used.
func New(dev gpu.Device, f *safetensors.File, cfg Config) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	up, _ := cfg.upsampleStride()
	d := &Decoder{
		cfg:      cfg,
		dev:      dev,
		q:        gpu.NewUrgentQueue(dev, "mimi"),
		bins:     cfg.Quantizer.Bins,
		upStride: up,
		frameLen: cfg.FrameSamples(),
		maxChunk: defaultMaxChunk,
		maxPass:  maxPassFor(dev),
		arena:    nn.NewArena(dev),
	}
	if fp, ok := d.q.(gpu.FP32Products); ok {
		fp.UseFP32Products() // an fp32 network, as the reference runs it
	}
	bl := &builder{dev: dev, q: d.q}
	wb := weights.New(dev, f)
	d.bind(bl, wb)
	d.owned, d.states = bl.owned, bl.states
	err := wb.Err()
	if extra := wb.Unexpected(); err == nil && len(extra) > 0 {
		if len(extra) > 5 {
			extra = append(extra[:5:5], fmt.Sprintf("… %d more", len(extra)-5))
		}
		label := f.Path
		if label == "" {
			label = "checkpoint"
		}
		err = fmt.Errorf("%s: tensors the configuration does not use: %s", label, strings.Join(extra, ", "))
	}
	if err != nil {
		d.free()
		return nil, fmt.Errorf("load mimi: %w", err)
	}
	return d, nil
}

func (d *Decoder) bind(bl *builder, wb *weights.Binder) {
	cfg := &d.cfg
	s, qc := &cfg.SEANet, &cfg.Quantizer

	// Encoder side: present in the checkpoint, unused by decoding.
	wb.SkipPrefix("encoder.")
	wb.SkipPrefix("encoder_transformer.")
	wb.SkipPrefix("downsample.")

	// Quantizer.
	d.first = bindRVQ(bl, wb.Sub("quantizer.rvq_first"), qc, qc.NQSemantic, qc.NQSemantic)
	d.rest = bindRVQ(bl, wb.Sub("quantizer.rvq_rest"), qc, qc.NQ-qc.NQSemantic, cfg.NumCodebooksActive-qc.NQSemantic)

	// Upsampling from the frame rate to the SEANet rate.
	dim := s.Dimension
	if d.upStride > 1 {
		ub := wb.Sub("upsample.convtr.convtr.convtr")
		u := d.upStride
		if cfg.channelWise() {
			d.up = newConvTr(bl, ub, dim, dim, 2*u, u, true, false)
		} else {
			d.up = newConvTr(bl, ub, dim, dim, 2*u, u, false, false)
		}
	}

	d.tr = newTransformer(wb.Sub("decoder_transformer"), &cfg.Transformer)

	// SEANet decoder: moshi's nn.Sequential indices.
	db := wb.Sub("decoder.model")
	replicate := s.PadMode == "replicate"
	mult := 1 << len(s.Ratios)
	idx := 0
	d.dec.in = newConv1d(bl, db.Subf("%d.conv.conv", idx), dim, mult*s.NFilters, s.KernelSize, 1, replicate)
	idx++
	for _, r := range s.Ratios {
		ch := mult * s.NFilters / 2
		st := seanetStage{up: newConvTr(bl, db.Subf("%d.convtr.convtr", idx+1), mult*s.NFilters, ch, 2*r, r, false, true)}
		idx += 2 // ELU, ConvTranspose1d
		hidden := ch / s.Compress
		dil := 1
		for j := 0; j < s.NResidualLayers; j++ {
			rb := db.Subf("%d", idx)
			res := resBlock{
				c1: newConv1d(bl, rb.Sub("block.1.conv.conv"), ch, hidden, s.ResidualKernelSize, dil, replicate),
				c2: newConv1d(bl, rb.Sub("block.3.conv.conv"), hidden, ch, 1, 1, replicate),
			}
			if !s.TrueSkip {
				res.skip = newConv1d(bl, rb.Sub("shortcut.conv.conv"), ch, ch, 1, 1, replicate)
			}
			st.res = append(st.res, res)
			idx++
			dil *= s.DilationBase
		}
		d.dec.stages = append(d.dec.stages, st)
		mult /= 2
	}
	d.dec.out = newConv1d(bl, db.Subf("%d.conv.conv", idx+1), s.NFilters, s.Channels, s.LastKernelSize, 1, replicate)
}

// bindRVQ binds the output side of a ResidualVectorQuantizer with total
// codebooks of which the first used are decoded.
func bindRVQ(bl *builder, wb *weights.Binder, qc *QuantizerConfig, total, used int) rvq {
	bins, dim := qc.Bins, qc.Dimension
	r := rvq{n: used}
	table := make([]float32, used*bins*dim)
	for i := 0; i < total; i++ {
		cb := wb.Subf("vq.layers.%d._codebook", i)
		if i >= used {
			cb.SkipPrefix("")
			continue
		}
		cb.Skip("_initialized", "inited")
		// EuclideanCodebook.embedding: embedding_sum / clamp(cluster_usage,
		// min=epsilon), in float32. Older names are the ones moshi's load
		// hook renames.
		sum := cb.Values(alias(cb, "embedding_sum", "embed_sum", "embed_avg"), bins, dim)
		usage := cb.Values(alias(cb, "cluster_usage", "cluster_size"), bins)
		const epsilon = float32(1e-5)
		for b := 0; b < bins; b++ {
			u := max(usage[b], epsilon)
			for c := 0; c < dim; c++ {
				table[(i*bins+b)*dim+c] = sum[b*dim+c] / u
			}
		}
	}
	r.table = bl.upload(used*bins, dim, table)
	wb.Skip("input_proj.weight") // encoder side
	r.proj = wb.Tensor("output_proj.weight", qc.OutputDimension, dim, 1)
	return r
}

// alias returns the first of names the checkpoint holds, or the first.
func alias(b *weights.Binder, names ...string) string {
	for _, n := range names {
		if b.Has(n) {
			return n
		}
	}
	return names[0]
}

// Config returns the decoder's configuration.
func (d *Decoder) Config() Config { return d.cfg }

// SampleRate returns the output sample rate in Hz.
func (d *Decoder) SampleRate() int { return d.cfg.SampleRate }

// Codebooks returns the number of codes each frame holds.
func (d *Decoder) Codebooks() int { return d.cfg.NumCodebooksActive }

// FrameSamples returns the number of samples each frame decodes to.
func (d *Decoder) FrameSamples() int { return d.frameLen }

// Close releases the decoder's memory (and the checkpoint Load opened).
// Streams must not be used afterwards.
func (d *Decoder) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.free()
	if d.file != nil {
		err := d.file.Close()
		d.file = nil
		return err
	}
	return nil
}

func (d *Decoder) free() {
	for _, t := range d.owned {
		d.dev.Free(t)
	}
	d.owned = nil
	d.arena.Free()
}

// Decode decodes a whole utterance with a fresh stream: the same
// computation as streaming the frames in any number of calls.
func (d *Decoder) Decode(ctx context.Context, codes [][]int) ([]float32, error) {
	s := d.NewStream()
	defer s.Close()
	return s.DecodeFrames(ctx, codes)
}

// Stream is one utterance's decoding state. A Stream must not be used from
// two goroutines at once.
type Stream struct {
	d      *Decoder
	state  []gpu.Tensor
	kv     []kvCache
	frames int // frames decoded so far
	closed bool
}

// kvCache holds one layer's keys and values: rows [0, n) are the n most
// recent positions, the last at position next−1.
type kvCache struct {
	k, v gpu.Tensor // [capacity, d], nil until first use
	n    int
}

// NewStream starts an utterance.
func (d *Decoder) NewStream() *Stream {
	s := &Stream{d: d, kv: make([]kvCache, len(d.tr.layers))}
	for _, sh := range d.states {
		s.state = append(s.state, d.dev.Alloc(gpu.F32, sh.rows, sh.cols))
	}
	return s
}

// Frames returns the number of frames the stream has decoded.
func (s *Stream) Frames() int { return s.frames }

// Reset starts a new utterance on the stream's memory.
func (s *Stream) Reset() {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	for _, t := range s.state {
		s.d.q.Fill(t, 0)
	}
	for i := range s.kv {
		s.kv[i].n = 0
	}
	s.frames = 0
}

// Close releases the stream's memory; closing twice is harmless.
func (s *Stream) Close() {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.closed {
		return
	}
	for _, t := range s.state {
		s.d.dev.Free(t)
	}
	for _, c := range s.kv {
		if !c.k.IsNil() {
			s.d.dev.Free(c.k)
			s.d.dev.Free(c.v)
		}
	}
	s.state, s.kv, s.closed = nil, nil, true
}

// DecodeFrames decodes the next frames of the utterance and returns their
// len(codes)·FrameSamples() samples. Codes must lie in 0..bins−1; a frame
// holding the end-of-audio code (bins) gives an error wrapping
// ErrEndOfAudio, and any bad code leaves the stream untouched.
func (s *Stream) DecodeFrames(ctx context.Context, codes [][]int) ([]float32, error) {
	return s.AppendFrames(ctx, nil, codes)
}

// AppendFrames is DecodeFrames appending the samples to dst. When ctx ends
// during a call, it returns the samples of the frames decoded so far (the
// stream has advanced by those frames) and ctx's error.
func (s *Stream) AppendFrames(ctx context.Context, dst []float32, codes [][]int) ([]float32, error) {
	out := [][]float32{dst}
	err := s.d.appendBatch(ctx, out, []*Stream{s}, [][][]int{codes})
	return out[0], err
}

// DecodeBatch decodes the next frames of several streams in the same
// passes: codes[i] are streams[i]'s next frames (any number, none
// included), and the result's element i their len(codes[i])·FrameSamples()
// samples. Every stream advances exactly as its own DecodeFrames would and
// gets exactly (bit for bit) the samples DecodeFrames would give it: the
// per-row layers (the projections, norms, activations and the convolutions'
// products) run once over all the streams' rows, while attention and the
// convolutions' carried state stay each stream's own, moved and attended
// for all the streams in batched ops (gpu.CopyMany, gpu.AttentionSeqs): a
// pass gives the queue the same ops for any number of streams. The passes
// take up to 16 frames of a stream and 32 in all, so a large batch needs
// no more scratch than one such pass. A bad code in any stream's frames,
// a stream named twice, a closed stream or one of another decoder is an
// error before any stream advances. When ctx ends during a call, every
// stream keeps the samples of the frames decoded so far (and has advanced
// by those) and the error is ctx's.
func (d *Decoder) DecodeBatch(ctx context.Context, streams []*Stream, codes [][][]int) ([][]float32, error) {
	out := make([][]float32, len(streams))
	err := d.appendBatch(ctx, out, streams, codes)
	return out, err
}

// appendBatch is DecodeBatch appending stream i's samples to dst[i].
func (d *Decoder) appendBatch(ctx context.Context, dst [][]float32, streams []*Stream, codes [][][]int) error {
	if len(codes) != len(streams) {
		return fmt.Errorf("mimi: %d frame lists for %d streams", len(codes), len(streams))
	}
	for i, c := range codes {
		if err := d.checkCodes(c); err != nil {
			if len(streams) > 1 {
				return fmt.Errorf("stream %d of the batch: %w", i, err)
			}
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, s := range streams {
		switch {
		case s.d != d:
			return fmt.Errorf("mimi: stream %d of the batch belongs to another decoder", i)
		case s.closed:
			return errors.New("mimi: decode on a closed stream")
		}
		for _, o := range streams[:i] {
			if o == s {
				return fmt.Errorf("mimi: stream %d of the batch is named twice", i)
			}
		}
	}
	left := 0 // frames still to decode
	for i, c := range codes {
		dst[i] = grow(dst[i], len(c)*d.frameLen)
		left += len(c)
	}
	done := make([]int, len(codes))    // frames decoded of each stream's
	most := max(d.maxPass, d.maxChunk) // a stream alone takes maxChunk
	b := &d.batch
	for left > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		// This pass: the streams' next frames, up to maxChunk of a stream
		// and maxPass (or maxChunk, if more) in all.
		b.streams, b.idx, b.codes, b.n, b.off = b.streams[:0], b.idx[:0], b.codes[:0], b.n[:0], b.off[:0]
		b.frames = 0
		for i, c := range codes {
			n := min(len(c)-done[i], d.maxChunk, most-b.frames)
			if n <= 0 {
				continue
			}
			part := c[done[i] : done[i]+n]
			b.streams, b.idx, b.codes = append(b.streams, streams[i]), append(b.idx, i), append(b.codes, part)
			b.n, b.off = append(b.n, n), append(b.off, b.frames)
			b.frames += n
			done[i] += n
		}
		left -= b.frames
		d.arena.Reset()
		y := d.pass(b)
		per := y.Len() / b.frames // samples per frame
		if len(b.streams) == 1 {
			i := b.idx[0]
			n := len(dst[i])
			dst[i] = dst[i][:n+y.Len()]
			if err := d.q.Read(dst[i][n:], y); err != nil {
				dst[i] = dst[i][:n]
				return fmt.Errorf("mimi: read samples: %w", err)
			}
		} else {
			if cap(d.samples) < y.Len() {
				d.samples = make([]float32, y.Len())
			}
			all := d.samples[:y.Len()]
			if err := d.q.Read(all, y); err != nil {
				return fmt.Errorf("mimi: read samples: %w", err)
			}
			for k, i := range b.idx {
				dst[i] = append(dst[i], all[b.off[k]*per:(b.off[k]+b.n[k])*per]...)
			}
		}
		for k, s := range b.streams {
			s.frames += b.n[k]
		}
	}
	return nil
}

// batch is one pass over several streams' frames. Every activation of the
// pass holds the streams' rows one stream after another: at r rows per
// frame, stream k's are rows [off[k]·r, (off[k]+n[k])·r).
type batch struct {
	streams []*Stream
	idx     []int     // the streams' indices in the call
	codes   [][][]int // the streams' frames in this pass
	n, off  []int
	frames  int // Σ n

	pos        []int32        // scratch: transformer positions
	ids1, ids2 []int32        // scratch: codebook rows
	pairs      []gpu.CopyPair // scratch: a CopyMany's copies
	pairs2     []gpu.CopyPair // scratch: a second CopyMany's
	seqs       []gpu.AttnSeq  // scratch: attention sequences
	freed      []gpu.Tensor   // scratch: caches to free
}

// rows returns stream k's rows of an activation of the pass with rows rows.
func (b *batch) rows(k, rows int) (lo, hi int) {
	r := rows / b.frames
	return b.off[k] * r, (b.off[k] + b.n[k]) * r
}

func grow(s []float32, n int) []float32 {
	if cap(s)-len(s) >= n {
		return s
	}
	g := make([]float32, len(s), len(s)+n)
	copy(g, s)
	return g
}

// checkCodes rejects frames of the wrong size, end-of-audio frames and
// codes outside the codebooks.
func (d *Decoder) checkCodes(codes [][]int) error {
	for f, fr := range codes {
		if len(fr) != d.cfg.NumCodebooksActive {
			return fmt.Errorf("mimi: frame %d has %d codes, want %d (one per active codebook)", f, len(fr), d.cfg.NumCodebooksActive)
		}
		for i, c := range fr {
			if c == d.bins {
				return fmt.Errorf("mimi: frame %d codebook %d: code %d: %w (decode only the frames before it)", f, i, c, ErrEndOfAudio)
			}
			if c < 0 || c >= d.bins {
				return fmt.Errorf("mimi: frame %d codebook %d: code %d outside 0..%d", f, i, c, d.bins-1)
			}
		}
	}
	return nil
}

// pass decodes the batch's frames (at most maxChunk per stream) and
// returns the samples [frames·frameLen, channels] in the arena.
func (d *Decoder) pass(b *batch) gpu.Tensor {
	x := d.quantizerDecode(b) // [T, dim] at the frame rate
	if d.up != nil {
		y := d.arena.Get(x.Rows*d.upStride, x.Cols)
		d.up.forward(d, b, y, x) // [T·u, dim] at the SEANet rate
		x = y
	}
	x = d.tr.forward(d, b, x)
	return d.dec.forward(d, b, x)
}

// quantizerDecode is SplitResidualVectorQuantizer.decode: each part sums
// its codebooks' vectors and projects them; the parts are added.
func (d *Decoder) quantizerDecode(b *batch) gpu.Tensor {
	q, a := d.q, d.arena
	T, n1, n2 := b.frames, d.first.n, d.rest.n
	b.ids1, b.ids2 = b.ids1[:0], b.ids2[:0]
	for _, codes := range b.codes {
		for _, fr := range codes {
			for i := 0; i < n1; i++ {
				b.ids1 = append(b.ids1, int32(i*d.bins+fr[i]))
			}
			for i := 0; i < n2; i++ {
				b.ids2 = append(b.ids2, int32(i*d.bins+fr[n1+i]))
			}
		}
	}
	dim := d.first.table.Cols
	e1, e2 := a.Get(T, dim), a.Get(T, dim)
	q.Embed(e1, d.first.table, b.ids1)
	q.Embed(e2, d.rest.table, b.ids2)
	out := d.first.proj.Rows
	y, y2 := a.Get(T, out), a.Get(T, out)
	q.MatMul(y, e1, d.first.proj, gpu.Tensor{})
	q.MatMul(y2, e2, d.rest.proj, gpu.Tensor{})
	q.Add(y, y, y2)
	return y
}

// positions returns the transformer positions of the pass's rows (rows
// per stream in order).
func (b *batch) positions(rows, upStride int) []int32 {
	b.pos = b.pos[:0]
	for k, s := range b.streams {
		p0 := s.frames * upStride
		lo, hi := b.rows(k, rows)
		for i := 0; i < hi-lo; i++ {
			b.pos = append(b.pos, int32(p0+i))
		}
	}
	return b.pos
}

// appendKV adds every stream's keys and values of the pass (its rows of kh,
// vh) to its layer-i cache and returns the attention sequences of the
// pass's queries: each stream's rows over the cached rows they need. The
// queue gets the same ops for any number of streams: one CopyMany, and one
// before it when a cache compacts.
func (b *batch) appendKV(d *Decoder, t *transformer, i int, kh, vh gpu.Tensor) []gpu.AttnSeq {
	// A compaction moves the rows still visible to the front of the cache
	// through tmp (a copy's source and destination must not overlap):
	// every compacting stream's to tmp first, then back with the appends.
	tmpRows := 0
	for k, s := range b.streams {
		if lo, hi := b.rows(k, kh.Rows); t.compacts(&s.kv[i], hi-lo) {
			tmpRows += 2 * t.keep(s.kv[i].n)
		}
	}
	var tmp gpu.Tensor
	if tmpRows > 0 {
		tmp = d.arena.Get(tmpRows, t.d)
	}
	moved, pairs, freed := b.pairs[:0], b.pairs2[:0], b.freed[:0]
	b.seqs = b.seqs[:0]
	tmpRows = 0
	for k, s := range b.streams {
		c := &s.kv[i]
		lo, hi := b.rows(k, kh.Rows)
		T := hi - lo
		keep := t.keep(c.n)
		if c.k.IsNil() || c.n+T > c.k.Rows {
			need := keep + T
			if c.k.IsNil() || need > c.k.Rows {
				// Grow: room for a context's worth of calls before
				// compacting.
				capacity := max(need, 2*t.context, 64)
				if !c.k.IsNil() {
					capacity = max(capacity, 2*c.k.Rows)
				}
				k, v := d.dev.Alloc(gpu.F32, capacity, t.d), d.dev.Alloc(gpu.F32, capacity, t.d)
				if keep > 0 {
					pairs = append(pairs,
						gpu.CopyPair{Dst: k.Slice(0, keep), Src: c.k.Slice(c.n-keep, c.n)},
						gpu.CopyPair{Dst: v.Slice(0, keep), Src: c.v.Slice(c.n-keep, c.n)})
				}
				if !c.k.IsNil() {
					freed = append(freed, c.k, c.v) // once the copies are queued
				}
				c.k, c.v = k, v
			} else if keep > 0 { // t.compacts
				tk, tv := tmp.Slice(tmpRows, tmpRows+keep), tmp.Slice(tmpRows+keep, tmpRows+2*keep)
				tmpRows += 2 * keep
				moved = append(moved,
					gpu.CopyPair{Dst: tk, Src: c.k.Slice(c.n-keep, c.n)},
					gpu.CopyPair{Dst: tv, Src: c.v.Slice(c.n-keep, c.n)})
				pairs = append(pairs,
					gpu.CopyPair{Dst: c.k.Slice(0, keep), Src: tk},
					gpu.CopyPair{Dst: c.v.Slice(0, keep), Src: tv})
			}
			c.n = keep
		}
		pairs = append(pairs,
			gpu.CopyPair{Dst: c.k.Slice(c.n, c.n+T), Src: kh.Slice(lo, hi)},
			gpu.CopyPair{Dst: c.v.Slice(c.n, c.n+T), Src: vh.Slice(lo, hi)})
		c.n += T
		start := c.n - T - keep
		b.seqs = append(b.seqs, gpu.AttnSeq{Rows: T, QPos0: keep, K: c.k.Slice(start, c.n), V: c.v.Slice(start, c.n)})
	}
	if len(moved) > 0 {
		gpu.CopyMany(d.q, moved)
	}
	gpu.CopyMany(d.q, pairs)
	for _, f := range freed {
		d.dev.Free(f)
	}
	clear(freed)
	b.pairs, b.pairs2, b.freed = moved, pairs, freed[:0]
	return b.seqs
}

// compacts says whether adding T rows to cache c moves the rows still
// visible to the front of its memory (they and the T rows fit, after the
// cached rows they do not).
func (t *transformer) compacts(c *kvCache, T int) bool {
	keep := t.keep(c.n)
	return !c.k.IsNil() && c.n+T > c.k.Rows && keep+T <= c.k.Rows && keep > 0
}

// forward runs the SEANet decoder over x [T, dim] and returns the samples.
func (n *seanet) forward(d *Decoder, b *batch, x gpu.Tensor) gpu.Tensor {
	q, a := d.q, d.arena
	y := a.Get(x.Rows, n.in.cout)
	n.in.forward(d, b, y, x)
	x = y
	for _, st := range n.stages {
		e := a.Get(x.Rows, x.Cols)
		q.Act(e, x, gpu.ELU)
		y := a.Get(x.Rows*st.up.stride, st.up.cout)
		st.up.forward(d, b, y, e)
		x = y
		for i := range st.res {
			x = st.res[i].forward(d, b, x)
		}
	}
	e := a.Get(x.Rows, x.Cols)
	q.Act(e, x, gpu.ELU)
	y = a.Get(x.Rows, n.out.cout)
	n.out.forward(d, b, y, e)
	return y
}

func (r *resBlock) forward(d *Decoder, b *batch, x gpu.Tensor) gpu.Tensor {
	q, a := d.q, d.arena
	e := a.Get(x.Rows, x.Cols)
	q.Act(e, x, gpu.ELU)
	h := a.Get(x.Rows, r.c1.cout)
	r.c1.forward(d, b, h, e)
	q.Act(h, h, gpu.ELU)
	v := a.Get(x.Rows, r.c2.cout)
	r.c2.forward(d, b, v, h)
	u := x
	if r.skip != nil {
		u = a.Get(x.Rows, r.skip.cout)
		r.skip.forward(d, b, u, x)
	}
	q.Add(v, u, v)
	return v
}
