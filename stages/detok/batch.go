package detok

import (
	"context"
	"errors"
	"fmt"

	"github.com/omni-pipe/omni-pipe/stages/lfm2"
)

// defaultMaxPass bounds the frames (of all the streams) one DecodeBatch
// pass decodes, so that a large batch needs no more scratch than a pass of
// that many frames (6 network rows each); the samples do not depend on it.
const defaultMaxPass = 32

// DecodeBatch decodes the next frames of several streams in the same
// passes: codes[i] are streams[i]'s next frames (any number, none
// included), and the result's element i the samples they complete, exactly
// (bit for bit) what streams[i].Decode(codes[i]) would return, each stream
// advancing as its own Decode would. The per-row layers (the embedding,
// the projections, norms, feed-forwards and the head) run once over every
// stream's rows, so their weights are read once per pass, while the
// convolutions' rows, the sliding-window keys and values, the positions and
// the overlap-add's tail stay each stream's own. A pass takes at most 32
// frames in all. A bad code in any stream's frames, a stream named twice, a
// closed or flushed stream or one of another decoder is an error before
// any stream advances. When ctx ends during a call, every stream keeps the
// samples of the frames decoded so far (and has advanced by those) and the
// error is ctx's.
func (d *Decoder) DecodeBatch(ctx context.Context, streams []*Stream, codes [][][]int) ([][]float32, error) {
	out := make([][]float32, len(streams))
	err := d.appendBatch(ctx, out, streams, codes)
	return out, err
}

// appendBatch is DecodeBatch appending stream i's samples to dst[i].
func (d *Decoder) appendBatch(ctx context.Context, dst [][]float32, streams []*Stream, codes [][][]int) error {
	if len(codes) != len(streams) {
		return fmt.Errorf("detokenizer: %d frame lists for %d streams", len(codes), len(streams))
	}
	for i, c := range codes {
		if err := d.CheckCodes(c); err != nil {
			if len(streams) > 1 {
				return fmt.Errorf("stream %d of the batch: %w", i, err)
			}
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return errors.New("detokenizer: decode after the decoder's Close")
	}
	for i, s := range streams {
		switch {
		case s == nil:
			return fmt.Errorf("detokenizer: stream %d of the batch is nil", i)
		case s.d != d:
			return fmt.Errorf("detokenizer: stream %d of the batch belongs to another decoder", i)
		case s.cache == nil:
			return fmt.Errorf("detokenizer: stream %d of the batch: decode on a closed stream", i)
		case s.flushed:
			return fmt.Errorf("detokenizer: stream %d of the batch: decode after Flush", i)
		}
		for _, o := range streams[:i] {
			if o == s {
				return fmt.Errorf("detokenizer: stream %d of the batch is named twice", i)
			}
		}
	}
	left := 0 // frames still to decode
	for _, c := range codes {
		left += len(c)
	}
	done := make([]int, len(codes)) // frames decoded of each stream's
	var (
		idx   []int // the pass's streams, by their index in the call
		n     []int // and their frames in the pass
		seqs  []lfm2.Seq
		frame [][]int
	)
	W := d.cfg.OutputSize
	for left > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		idx, n, seqs, frame = idx[:0], n[:0], seqs[:0], frame[:0]
		for i, c := range codes {
			k := min(len(c)-done[i], d.maxPass-len(frame))
			if k <= 0 {
				continue
			}
			idx, n = append(idx, i), append(n, k)
			seqs = append(seqs, lfm2.Seq{Cache: streams[i].cache, Rows: Upsample * k})
			frame = append(frame, c[done[i]:done[i]+k]...)
			done[i] += k
		}
		left -= len(frame)
		spec, err := d.forwardSeqs(seqs, frame, nil, false)
		if err != nil {
			return fmt.Errorf("detokenizer batch: %w", err)
		}
		off := 0
		for k, i := range idx {
			rows := spec[off*Upsample*W : (off+n[k])*Upsample*W]
			s := streams[i]
			s.frames += n[k]
			dst[i] = s.overlapAdd(dst[i], rows)
			off += n[k]
		}
	}
	return nil
}
