package lfm2

import (
	"errors"
	"fmt"
	"sync"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// KVBlock is the default block size of the key/value pools, in positions
// (Model.KVBlockRows overrides it). A conversation holds its positions
// rounded up to whole blocks, so a block is what it may waste: 64
// positions of LFM2-Audio's backbone (6 attention layers, 8 KV heads of 64
// dims, fp32 keys and values: 24 KiB a position) are 1.5 MiB, against 6 MiB
// for the 256-position steps the caches grew by before they were paged.
// Smaller blocks waste less but cut every attention item's keys into more
// runs (one product call each on the CPU) and lengthen the tables; at 64
// a block of one layer's keys is 128 KiB of adjacent rows, long enough to
// stream at full bandwidth on either backend.
const KVBlock = 64

// ErrKVPoolFull is returned (wrapped) when a cache needs blocks that its
// pool, at its limit, does not have.
var ErrKVPoolFull = errors.New("lfm2: the KV pool has no free block")

// KVPool holds the keys and values of every cache of a model on one device
// (vLLM's PagedAttention layout): per attention layer a K and a V pool of
// fixed-size blocks, handed to caches from a free list. A cache owns a list
// of blocks (its block table) per group of layers that share a window;
// growing a cache appends blocks to its table and copies nothing, and Free
// returns them. Attention reads a cache's keys through its table
// (gpu.AttnParams.Blocks).
//
// The pool is allocated on demand, in whole blocks: when its free list
// cannot serve a request it reallocates its layer pools with room for at
// least twice the blocks (up to its limit, SetMaxBlocks), copying the
// blocks in use once; a pool that has reached the largest number of blocks
// its caches hold at once allocates nothing more. A turn's blocks are
// taken when it is admitted (Cache.Grow), so its passes take none.
//
// Tables and the free list are guarded by a mutex, but growth moves the
// pools: the caches of one pool must be computed (Forward, Grow) on one
// queue at a time, as the engine's backbone stage and the detokenizer do.
type KVPool struct {
	m    *Model
	dev  gpu.Device
	rows int // rows (positions) per block

	mu     sync.Mutex
	groups []*kvGroup
	max    int // blocks per group; 0: no limit
}

// kvGroup is the pool of the attention layers of one window: a block id
// names the same rows in each of its layers' pools.
type kvGroup struct {
	window int
	layers []int        // the model's layer indices
	k, v   []gpu.Tensor // per member: [blocks·rows, KVHeads·HeadD]
	blocks int          // allocated
	free   []int32      // free block ids, the next taken last
	bytes  int64        // one block's bytes over every member's K and V
}

// KVPoolStats counts a pool's blocks, over all its groups.
type KVPoolStats struct {
	Blocks int   // allocated
	Free   int   // on the free list
	Bytes  int64 // device memory of the allocated blocks
}

// KVPool returns m's key/value pool on dev, creating it (empty) on first
// use. Every cache of m on dev takes its blocks from it.
func (m *Model) KVPool(dev gpu.Device) *KVPool {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	if p := m.pools[dev]; p != nil {
		return p
	}
	rows := m.KVBlockRows
	if rows <= 0 {
		rows = KVBlock
	}
	p := &KVPool{m: m, dev: dev, rows: rows}
	byWindow := map[int]*kvGroup{}
	for i, b := range m.Blocks {
		if b.Attn == nil {
			continue
		}
		g := byWindow[b.Attn.Window]
		if g == nil {
			g = &kvGroup{window: b.Attn.Window}
			byWindow[b.Attn.Window] = g
			p.groups = append(p.groups, g)
		}
		g.layers = append(g.layers, i)
		g.k, g.v = append(g.k, gpu.Tensor{}), append(g.v, gpu.Tensor{})
		g.bytes += int64(rows) * m.kvRowBytes(b.Attn)
	}
	if m.pools == nil {
		m.pools = map[gpu.Device]*KVPool{}
	}
	m.pools[dev] = p
	return p
}

// BlockRows returns the positions of one block.
func (p *KVPool) BlockRows() int { return p.rows }

// SetMaxBlocks limits every group of layers to n blocks (0: no limit,
// the default); a pool already larger keeps its blocks.
func (p *KVPool) SetMaxBlocks(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.max = max(0, n)
}

// Stats returns the pool's block counts.
func (p *KVPool) Stats() KVPoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s KVPoolStats
	for _, g := range p.groups {
		s.Blocks += g.blocks
		s.Free += len(g.free)
		s.Bytes += int64(g.blocks) * g.bytes
	}
	return s
}

// take appends n blocks of group g to ids, growing the pool (on q) when
// its free list is short. It takes nothing when the pool, at its limit,
// cannot give all n.
func (p *KVPool) take(q gpu.Queue, g *kvGroup, ids []int32, n int) ([]int32, error) {
	if n <= 0 {
		return ids, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if short := n - len(g.free); short > 0 {
		nb := max(g.blocks+short, 2*g.blocks, 8)
		if p.max > 0 {
			nb = min(nb, p.max)
		}
		if nb < g.blocks+short {
			return ids, fmt.Errorf("%w: %d blocks wanted, %d free of %d (limit %d)", ErrKVPoolFull, n, len(g.free), g.blocks, p.max)
		}
		p.grow(q, g, nb)
	}
	for range n {
		last := len(g.free) - 1
		ids = append(ids, g.free[last])
		g.free = g.free[:last]
	}
	return ids, nil
}

// grow reallocates g's layer pools with nb blocks, copying the blocks
// already allocated (p.mu held).
func (p *KVPool) grow(q gpu.Queue, g *kvGroup, nb int) {
	for mi, li := range g.layers {
		a := p.m.Blocks[li].Attn
		for _, t := range []*gpu.Tensor{&g.k[mi], &g.v[mi]} {
			nt := p.dev.Alloc(gpu.F32, nb*p.rows, a.KVHeads*a.HeadD)
			if !t.IsNil() {
				q.Copy(nt.Slice(0, t.Rows), *t)
				p.dev.Free(*t)
			}
			*t = nt
		}
	}
	// New blocks go on the free list so that the lowest ids are taken
	// first.
	for b := nb - 1; b >= g.blocks; b-- {
		g.free = append(g.free, int32(b))
	}
	g.blocks = nb
}

// give returns blocks of group g to the free list.
func (p *KVPool) give(g *kvGroup, ids []int32) {
	if len(ids) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(ids) - 1; i >= 0; i-- {
		g.free = append(g.free, ids[i])
	}
}

// layerPools returns the K and V pools of layer i, in group g (p.mu not
// needed: only growth, on the computing queue, replaces them).
func (g *kvGroup) layerPools(i int) (k, v gpu.Tensor) {
	for mi, li := range g.layers {
		if li == i {
			return g.k[mi], g.v[mi]
		}
	}
	panic(fmt.Sprintf("lfm2: layer %d is not in the KV group", i))
}

// kvTable is a cache's blocks of one group: logical block first+j (the
// positions [(first+j)·rows, (first+j+1)·rows)) is pool block ids[j].
// Blocks before first have left a window and gone back to the pool.
type kvTable struct {
	g     *kvGroup
	ids   []int32
	first int
	dev   gpu.Tensor // I32 [1, capacity]: ids as Attention reads them
	dirty bool       // ids changed since dev was written
}

// upload writes the table to device memory if it changed, reallocating it
// when it outgrew its capacity (then a replayed graph's table argument
// changes once).
func (t *kvTable) upload(q gpu.Queue, dev gpu.Device) {
	if !t.dirty {
		return
	}
	if t.dev.IsNil() || t.dev.Cols < len(t.ids) {
		if !t.dev.IsNil() {
			dev.Free(t.dev)
		}
		t.dev = dev.Alloc(gpu.I32, 1, max(16, 2*len(t.ids)))
	}
	q.WriteInt(t.dev.ColSlice(0, len(t.ids)), t.ids)
	t.dirty = false
}
