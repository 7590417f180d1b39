package lfm2

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// loadWithBlocks loads the fixture's backbone afresh (a pool of its own)
// with KV blocks of rows positions.
func loadWithBlocks(t *testing.T, tm *testModel, rows int) *Model {
	t.Helper()
	f, err := safetensors.Open(fixtures + "model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m, err := Load(weights.New(tm.dev, f).Sub("lfm"), tm.cfg.LFM)
	if err != nil {
		t.Fatal(err)
	}
	m.KVBlockRows = rows
	return m
}

// contiguousRows is a block larger than any test's sequence: every cache's
// keys are one run of adjacent pool rows, the contiguous layout.
const contiguousRows = 1 << 12

// TestPagedEqualsContiguous: a prefill then steps, and a chunked prefill
// whose chunks span blocks, give bit for bit the rows of caches whose keys
// are contiguous, for blocks of 1, 3, 4 and 64 positions, in both
// precisions.
func TestPagedEqualsContiguous(t *testing.T) {
	tm := loadTestModel(t)
	H := tm.cfg.LFM.HiddenSize
	const N, k = 29, 9
	ref := loadWithBlocks(t, tm, contiguousRows)
	for _, prec := range []nn.Precision{nn.BF16, nn.F32} {
		c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), prec)
		x, _ := randomRows(tm.dev, c.Q, N+k, H, 7)
		// run feeds x in passes of the given sizes.
		run := func(m *Model, passes []int) []float32 {
			cache := m.NewCache(tm.dev)
			defer cache.Free()
			var out []float32
			r := 0
			for _, n := range passes {
				c.A.Reset()
				out = append(out, read(t, c, m.Forward(c, x.Slice(r, r+n), []Seq{{Cache: cache, Rows: n}}))...)
				r += n
			}
			return out
		}
		steps := []int{N}
		for range k {
			steps = append(steps, 1)
		}
		chunks := []int{5, 7, 2, 11, 4, 9} // 38 rows in chunks that start and end inside blocks
		want := map[string][]float32{"steps": run(ref, steps), "chunks": run(ref, chunks)}
		if !slices.Equal(want["steps"], want["chunks"]) {
			t.Fatalf("%v: contiguous steps and chunks differ", prec)
		}
		for _, br := range []int{1, 3, 4, 64} {
			m := loadWithBlocks(t, tm, br)
			for name, passes := range map[string][]int{"steps": steps, "chunks": chunks} {
				if got := run(m, passes); !slices.Equal(got, want[name]) {
					t.Errorf("%v: blocks of %d: %s differ from contiguous keys", prec, br, name)
				}
			}
		}
	}
}

// TestPagedInterleaved: six conversations fed in random batches and
// chunks, their blocks interleaved in a pool of 3-position blocks (and a
// conversation that is freed midway, its blocks taken by the others), give
// each conversation's rows alone on contiguous keys, bit for bit.
func TestPagedInterleaved(t *testing.T) {
	tm := loadTestModel(t)
	H := tm.cfg.LFM.HiddenSize
	c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), nn.BF16)
	const convs, length = 6, 24
	xs := make([]gpu.Tensor, convs)
	for i := range xs {
		xs[i], _ = randomRows(tm.dev, c.Q, length, H, uint64(40+i))
	}
	m := loadWithBlocks(t, tm, 3)
	caches := make([]*Cache, convs)
	for i := range caches {
		caches[i] = m.NewCache(tm.dev)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	got := make([][]float32, convs)
	passes := make([][]int, convs)
	const dropped, dropAt = 2, 10 // conversation 2 ends after 10 positions
	for {
		var seqs []Seq
		var who []int
		for i, cc := range caches {
			left := length - cc.Len()
			if i == dropped {
				left = dropAt - cc.Len()
			}
			if left == 0 || rng.IntN(3) == 0 {
				continue
			}
			n := min(left, 1+rng.IntN(5))
			seqs = append(seqs, Seq{Cache: cc, Rows: n})
			who = append(who, i)
		}
		if len(seqs) == 0 {
			done := true
			for i, cc := range caches {
				done = done && (cc.Len() == length || (i == dropped && cc.Len() == dropAt))
			}
			if done {
				break
			}
			continue
		}
		total := 0
		for _, s := range seqs {
			total += s.Rows
		}
		x := c.Tmp(total, H)
		r := 0
		for j, s := range seqs {
			pos := s.Cache.Len()
			c.Q.Copy(x.Slice(r, r+s.Rows), xs[who[j]].Slice(pos, pos+s.Rows))
			passes[who[j]] = append(passes[who[j]], s.Rows)
			r += s.Rows
		}
		out := read(t, c, m.Forward(c, x, seqs))
		r = 0
		for j, s := range seqs {
			got[who[j]] = append(got[who[j]], out[r*H:(r+s.Rows)*H]...)
			r += s.Rows
		}
		c.A.Reset()
		if caches[dropped].Len() == dropAt && caches[dropped].tabs != nil {
			caches[dropped].Free() // its blocks go to the others
		}
	}
	ref := loadWithBlocks(t, tm, contiguousRows)
	for i := range caches {
		alone := ref.NewCache(tm.dev)
		var want []float32
		r := 0
		for _, n := range passes[i] {
			want = append(want, read(t, c, ref.Forward(c, xs[i].Slice(r, r+n), []Seq{{Cache: alone, Rows: n}}))...)
			r += n
			c.A.Reset()
		}
		alone.Free()
		if !slices.Equal(got[i], want) {
			t.Errorf("conversation %d (passes %v) differs from its run alone", i, passes[i])
		}
	}
	// The pool never held more than the conversations' blocks at once.
	st := m.KVPool(tm.dev).Stats()
	groups := len(m.KVPool(tm.dev).groups)
	if most := groups * (convs * ((length + 2) / 3)); st.Blocks > 2*most {
		t.Errorf("the pool grew to %d blocks for at most %d in use", st.Blocks, most)
	}
	for _, cc := range caches {
		cc.Free()
	}
	if st := m.KVPool(tm.dev).Stats(); st.Free != st.Blocks {
		t.Errorf("after every Free %d of %d blocks are free", st.Free, st.Blocks)
	}
}

// TestPagedReuse: a conversation computed on blocks another conversation
// held and gave back (their old keys still in them) gives its rows on a
// fresh pool, and takes no new memory.
func TestPagedReuse(t *testing.T) {
	tm := loadTestModel(t)
	H := tm.cfg.LFM.HiddenSize
	c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), nn.BF16)
	const N = 20
	a, _ := randomRows(tm.dev, c.Q, N, H, 1)
	b, _ := randomRows(tm.dev, c.Q, N, H, 2)
	fresh := loadWithBlocks(t, tm, 4)
	fc := fresh.NewCache(tm.dev)
	want := read(t, c, fresh.Forward(c, b, []Seq{{Cache: fc, Rows: N}}))
	fc.Free()

	m := loadWithBlocks(t, tm, 4)
	ca := m.NewCache(tm.dev)
	read(t, c, m.Forward(c, a, []Seq{{Cache: ca, Rows: N}}))
	held := slices.Clone(ca.tabs[0].ids)
	ca.Free()
	c.A.Reset() // the arena's scratch is reused, not new memory
	used := gpu.DescribeDevice(tm.dev).MemUsed
	blocks := m.KVPool(tm.dev).Stats().Blocks
	cb := m.NewCache(tm.dev)
	got := read(t, c, m.Forward(c, b, []Seq{{Cache: cb, Rows: N}}))
	if !slices.Equal(got, want) {
		t.Error("a conversation on reused blocks differs from one on a fresh pool")
	}
	if !slices.Equal(cb.tabs[0].ids, held) {
		t.Errorf("the second conversation took blocks %v, not the %v the first gave back", cb.tabs[0].ids, held)
	}
	if st := m.KVPool(tm.dev).Stats(); st.Blocks != blocks {
		t.Errorf("the pool grew from %d to %d blocks with enough free", blocks, st.Blocks)
	}
	// Conv states and the block table are the cache's own memory.
	if grew := gpu.DescribeDevice(tm.dev).MemUsed - used; grew > cb.Bytes() {
		t.Errorf("device memory grew by %d bytes, more than the cache's conv states and table", grew)
	}
	cb.Free()
}

// TestPoolAccounting: Bytes counts a cache's blocks (its positions rounded
// up to blocks) and equals BytesFor, Free gives every block back, and a pool
// given a limit refuses what it does not have (Grow takes nothing then and
// says so) while the cache keeps working within what it has.
func TestPoolAccounting(t *testing.T) {
	tm := loadTestModel(t)
	H := tm.cfg.LFM.HiddenSize
	c := nn.NewCtx(tm.dev, tm.dev.NewQueue("test"), nn.BF16)
	m := loadWithBlocks(t, tm, 8)
	p := m.KVPool(tm.dev)
	if got := p.BlockRows(); got != 8 {
		t.Fatalf("BlockRows = %d", got)
	}
	groups := len(p.groups)
	x, _ := randomRows(tm.dev, c.Q, 30, H, 3)
	for _, n := range []int{1, 8, 9, 17, 30} {
		cc := m.NewCache(tm.dev)
		read(t, c, m.Forward(c, x.Slice(0, n), []Seq{{Cache: cc, Rows: n}}))
		if got, want := cc.Bytes(), m.BytesFor(n); got != want {
			t.Errorf("%d positions: Bytes %d, BytesFor %d", n, got, want)
		}
		st := p.Stats()
		if inUse, want := st.Blocks-st.Free, groups*((n+7)/8); inUse != want {
			t.Errorf("%d positions: %d blocks in use, want %d", n, inUse, want)
		}
		cc.Free()
		if st := p.Stats(); st.Free != st.Blocks || cc.Bytes() != 0 {
			t.Errorf("%d positions: after Free %d of %d blocks free, the cache holds %d bytes", n, st.Free, st.Blocks, cc.Bytes())
		}
	}
	if m.BytesFor(9) != m.BytesFor(16) || m.BytesFor(16) == m.BytesFor(17) {
		t.Error("BytesFor does not round positions up to blocks of 8")
	}

	// A fresh pool limited to 3 blocks a group.
	lim := loadWithBlocks(t, tm, 8)
	lp := lim.KVPool(tm.dev)
	lp.SetMaxBlocks(3)
	a := lim.NewCache(tm.dev)
	if err := a.Grow(c.Q, 16); err != nil {
		t.Fatalf("Grow to 2 of 3 blocks: %v", err)
	}
	b := lim.NewCache(tm.dev)
	err := b.Grow(c.Q, 16)
	if !errors.Is(err, ErrKVPoolFull) {
		t.Fatalf("Grow past the limit: %v, want ErrKVPoolFull", err)
	}
	if b.Bytes() != m.BytesFor(0) {
		t.Errorf("a refused Grow left the cache %d bytes, want its conv states' %d", b.Bytes(), m.BytesFor(0))
	}
	if st := lp.Stats(); st.Blocks != 3*groups || st.Free != 1*groups {
		t.Errorf("pool at its limit: %+v, want %d blocks, %d free", st, 3*groups, groups)
	}
	// b fits in the one free block a group: 8 positions work.
	out := read(t, c, lim.Forward(c, x.Slice(0, 8), []Seq{{Cache: b, Rows: 8}}))
	if len(out) != 8*H {
		t.Fatalf("forward gave %d values", len(out))
	}
	func() {
		defer func() {
			r := recover()
			if !strings.Contains(fmt.Sprint(r), ErrKVPoolFull.Error()) {
				t.Errorf("a forward past the pool's limit: recovered %v, want a panic naming ErrKVPoolFull", r)
			}
		}()
		lim.Forward(c, x.Slice(8, 9), []Seq{{Cache: b, Rows: 1}})
	}()
	a.Free()
	b.Free()
}
