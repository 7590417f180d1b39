package cuda

import (
	"hash/maphash"
	"slices"
	"unsafe"
)

// CUDA graphs. A stage's work between two reads (a backbone step, a
// depthformer codebook position, a codec chunk) is the same sequence of
// kernels every time it recurs; only some arguments change (positions,
// cache lengths, the addresses of rows appended to a cache). The queue
// therefore keeps, per launch sequence ("shape": kernels, grids, blocks,
// argument counts), an instantiated graph of one kernel node per launch,
// chained in order. A batch whose shape was seen before replays its graph:
// the nodes whose arguments differ from the graph's are updated in place
// (cuGraphExecKernelNodeSetParams), then one cuGraphLaunch replaces the
// batch's launches. A shape is built into a graph the second time it is
// seen (a one-off batch is not worth instantiating), and each batch-size
// bucket has its own shape, as the grids differ.

// kernelNodeParams is CUDA_KERNEL_NODE_PARAMS_v2.
type kernelNodeParams struct {
	fn                         uintptr
	gx, gy, gz, bx, by, bz, sm uint32
	_                          uint32
	params, extra, kern, ctx   uintptr
}

// minGraph is the fewest launches worth a graph.
const minGraph = 8

// maxGraphs bounds the graphs a queue keeps (least recently used go). A
// step's shape changes with its batch (how many sessions, how many text
// and audio rows, prefill chunks): at 256 sessions on an H200 a queue saw
// well over 64 shapes, and 64 graphs kept evicting and rebuilding them.
const maxGraphs = 256

type graphEntry struct {
	st    staging // the uploads of the graph's replays
	cmds  []cmd
	slots []uint64
	graph uintptr
	exec  uintptr
	nodes []uintptr
	used  uint64
}

type graphCache struct {
	seed    maphash.Seed
	seen    map[uint64]int
	entries map[uint64]*graphEntry
	clock   uint64
}

// shapeKey hashes what a graph's topology depends on.
func (g *graphCache) shapeKey(cmds []cmd) uint64 {
	if g.seen == nil {
		g.seed = maphash.MakeSeed()
		g.seen = map[uint64]int{}
		g.entries = map[uint64]*graphEntry{}
	}
	var h maphash.Hash
	h.SetSeed(g.seed)
	for _, c := range cmds {
		var b [48]byte
		*(*uintptr)(unsafe.Pointer(&b[0])) = c.fn
		*(*[3]uint32)(unsafe.Pointer(&b[8])) = c.grid
		*(*[2]uint32)(unsafe.Pointer(&b[20])) = c.block
		*(*uint32)(unsafe.Pointer(&b[28])) = c.shm
		*(*int32)(unsafe.Pointer(&b[32])) = c.na
		h.Write(b[:36])
	}
	return h.Sum64()
}

// sameShape reports whether two command lists launch the same kernels in
// the same configuration (argument values aside).
func sameCmdShape(a, b []cmd) bool {
	return slices.EqualFunc(a, b, func(x, y cmd) bool {
		return x.fn == y.fn && x.grid == y.grid && x.block == y.block && x.shm == y.shm && x.na == y.na && x.free == 0 && y.free == 0
	})
}

func nodeParams(c cmd, params []unsafe.Pointer) kernelNodeParams {
	p := kernelNodeParams{fn: c.fn, gx: c.grid[0], gy: c.grid[1], gz: c.grid[2], bx: c.block[0], by: c.block[1], bz: 1, sm: c.shm}
	if c.na > 0 {
		p.params = uintptr(unsafe.Pointer(&params[c.a0]))
	}
	return p
}

// graphable reports whether a batch may run as a graph: launches only (no
// frees), enough of them.
func graphable(r *batch) bool {
	if len(r.cmds) < minGraph {
		return false
	}
	for _, c := range r.cmds {
		if c.free != 0 || c.gemm != nil {
			return false
		}
	}
	return true
}

// runGraph runs the batch through a cached graph when it has one (or
// builds one the second time its shape is seen) and reports whether it did;
// on false the caller launches the batch directly. It runs on the owner
// thread after the arguments are final.
func (q *Queue) runGraph(r *batch, key uint64, e *graphEntry) (bool, error) {
	g := &q.graphs
	if e == nil && g.entries[key] != nil {
		return false, nil // a hash collision: run directly
	}
	c := q.d.drv
	if e == nil {
		g.seen[key]++
		if g.seen[key] < 2 {
			return false, nil
		}
		var err error
		if e, err = q.buildGraph(r); err != nil {
			return false, err
		}
		q.evict()
		g.entries[key] = e
	} else {
		for j, cm := range r.cmds {
			lo, hi := cm.a0, cm.a0+cm.na
			if slices.Equal(r.slots[lo:hi], e.slots[e.cmds[j].a0:e.cmds[j].a0+e.cmds[j].na]) {
				continue
			}
			q.stats.updates++
			np := nodeParams(cm, q.params)
			if err := c.call("cuGraphExecKernelNodeSetParams", c.cuGraphExecKernelNodeSetParams, e.exec, e.nodes[j], uintptr(unsafe.Pointer(&np))); err != nil {
				return false, err
			}
			copy(e.slots[e.cmds[j].a0:], r.slots[lo:hi])
		}
	}
	g.clock++
	e.used = g.clock
	if err := c.call("cuGraphLaunch", c.cuGraphLaunch, e.exec, q.stream); err != nil {
		return false, err
	}
	return true, nil
}

// lookupGraph returns r's shape key and the graph built for that shape
// (nil when there is none yet, or on a hash collision).
func (q *Queue) lookupGraph(r *batch) (uint64, *graphEntry) {
	key := q.graphs.shapeKey(r.cmds)
	e := q.graphs.entries[key]
	if e != nil && !sameCmdShape(e.cmds, r.cmds) {
		return key, nil
	}
	return key, e
}

func (q *Queue) buildGraph(r *batch) (*graphEntry, error) {
	c := q.d.drv
	e := &graphEntry{cmds: slices.Clone(r.cmds), slots: slices.Clone(r.slots), nodes: make([]uintptr, len(r.cmds))}
	if err := c.call("cuGraphCreate", c.cuGraphCreate, uintptr(unsafe.Pointer(&e.graph)), 0); err != nil {
		return nil, err
	}
	pdl := q.d.pdl.Load()
	var prev uintptr
	for j, cm := range r.cmds {
		np := nodeParams(cm, q.params)
		var deps uintptr
		var nd uintptr
		if j > 0 && !pdl {
			deps, nd = uintptr(unsafe.Pointer(&prev)), 1
		}
		if err := c.call("cuGraphAddKernelNode", c.cuGraphAddKernelNode, uintptr(unsafe.Pointer(&e.nodes[j])), e.graph, deps, nd, uintptr(unsafe.Pointer(&np))); err != nil {
			c.call("cuGraphDestroy", c.cuGraphDestroy, e.graph)
			return nil, err
		}
		if j > 0 && pdl {
			if err := addProgrammaticEdge(c, e.graph, prev, e.nodes[j]); err != nil {
				// A driver that refuses programmatic edges: chain this and
				// every later graph's nodes with full dependencies, and
				// launch kernels as before.
				c.call("cuGraphDestroy", c.cuGraphDestroy, e.graph)
				q.d.pdl.Store(false)
				return q.buildGraph(r)
			}
		}
		prev = e.nodes[j]
	}
	if err := c.call("cuGraphInstantiate", c.cuGraphInstantiate, uintptr(unsafe.Pointer(&e.exec)), e.graph, 0); err != nil {
		c.call("cuGraphDestroy", c.cuGraphDestroy, e.graph)
		return nil, err
	}
	return e, nil
}

// evict drops the least recently used graph when the cache is full.
func (q *Queue) evict() {
	g := &q.graphs
	if len(g.entries) < maxGraphs {
		return
	}
	var old uint64
	var oe *graphEntry
	for k, e := range g.entries {
		if oe == nil || e.used < oe.used {
			old, oe = k, e
		}
	}
	q.stats.evictions++
	c := q.d.drv
	c.call("cuGraphExecDestroy", c.cuGraphExecDestroy, oe.exec)
	c.call("cuGraphDestroy", c.cuGraphDestroy, oe.graph)
	q.retire(oe.st)
	delete(g.entries, old)
}

// maxSpare bounds the upload memory a queue keeps from evicted graphs.
const maxSpare = 8

// retire keeps an evicted graph's upload memory for a later graph instead
// of freeing it: freeing waits for the device to finish reading it (and
// cuMemFreeHost synchronises), which held the owner thread 3.4 of 40 s in
// a 64–256-session load whose batch sizes kept evicting graphs (owner
// thread).
func (q *Queue) retire(st staging) {
	if st.host == 0 && st.ev == 0 {
		return
	}
	if len(q.spare) >= maxSpare {
		q.spare[0].free(q.d.drv)
		q.spare = append(q.spare[:0], q.spare[1:]...)
	}
	q.spare = append(q.spare, st)
}

// adoptSpare gives st, a new graph's empty upload memory, a retired one
// that holds at least n bytes and that the device has finished reading;
// it reports whether it did (owner thread).
func (q *Queue) adoptSpare(st *staging, n int) bool {
	for i, sp := range q.spare {
		if sp.n < n || sp.pending && q.d.query(sp.ev) != cudaSuccess {
			continue
		}
		sp.pending = false
		*st = sp
		q.spare = append(q.spare[:i], q.spare[i+1:]...)
		return true
	}
	return false
}

func (q *Queue) destroyGraph(e *graphEntry) {
	c := q.d.drv
	c.call("cuGraphExecDestroy", c.cuGraphExecDestroy, e.exec)
	c.call("cuGraphDestroy", c.cuGraphDestroy, e.graph)
	e.st.free(c)
}
