package pipeline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/chat"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// ErrNoMemory is wrapped by the *MemoryError of a turn that the memory
// budget cannot hold.
var ErrNoMemory = errors.New("the memory budget cannot hold the turn")

// MemoryError refuses a turn: it needs Need bytes and Free are left of
// the budget. Turns that end and conversations that close give memory
// back, so a retry may succeed.
type MemoryError struct {
	Need, Free, Budget int64
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("%v: it needs %d bytes (KV cache, history, codec state), %d of %d are free", ErrNoMemory, e.Need, e.Free, e.Budget)
}

func (e *MemoryError) Unwrap() error { return ErrNoMemory }

// MemoryStats is the engine's memory in bytes: what conversations hold
// (KV caches and history) and running turns have reserved (the KV and
// history they may still fill, their codec streams), against the budget.
type MemoryStats struct {
	Budget  int64 `json:"budget_bytes"` // math.MaxInt64: no limit
	Used    int64 `json:"used_bytes"`   // KV + History + Codec
	KV      int64 `json:"kv_bytes"`
	History int64 `json:"history_bytes"`
	Codec   int64 `json:"codec_bytes"`
}

// ledger counts the engine's bytes against its budget.
type ledger struct {
	mu      sync.Mutex
	budget  int64
	kv      int64
	history int64
	codec   int64
}

func (l *ledger) stats() MemoryStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return MemoryStats{Budget: l.budget, Used: l.kv + l.history + l.codec, KV: l.kv, History: l.history, Codec: l.codec}
}

// charge adds a turn's reservation if the budget holds it.
func (l *ledger) charge(r bytesOf) *MemoryError {
	l.mu.Lock()
	defer l.mu.Unlock()
	used := l.kv + l.history + l.codec
	if need := r.sum(); need > 0 && used+need > l.budget {
		return &MemoryError{Need: need, Free: max(0, l.budget-used), Budget: l.budget}
	}
	l.add(r, 1)
	return nil
}

// add adds (sign 1) or removes (−1) r.
func (l *ledger) add(r bytesOf, sign int64) {
	l.kv += sign * r.kv
	l.history += sign * r.history
	l.codec += sign * r.codec
}

func (l *ledger) move(from, to bytesOf) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.add(from, -1)
	l.add(to, 1)
}

// bytesOf is a charge by kind.
type bytesOf struct{ kv, history, codec int64 }

func (b bytesOf) sum() int64 { return b.kv + b.history + b.codec }

// Memory returns the engine's memory in use and its budget.
func (e *Engine) Memory() MemoryStats { return e.mem.stats() }

// DefaultMemoryBudget is the budget the engine takes on dev when
// Options.MemoryBudget is not set: nine tenths of a GPU's memory that the
// process does not hold yet (the weights are loaded by then); on the CPU
// half the host's available memory (MemAvailable of /proc/meminfo; mapped
// weights count as available there), else 4 GiB.
func DefaultMemoryBudget(dev gpu.Device) int64 {
	info := gpu.DescribeDevice(dev)
	if info.MemTotal > 0 {
		return max(0, info.MemTotal-info.MemUsed) / 10 * 9
	}
	if avail, err := memAvailable("/proc/meminfo"); err == nil && avail > 0 {
		return avail / 2
	}
	return 4 << 30
}

// memAvailable reads MemAvailable from a meminfo file, in bytes.
func memAvailable(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: MemAvailable %q: %w", path, rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no MemAvailable", path)
}

// kvSizer is a backbone cache that says what it holds (stages/lfm2's
// Cache).
type kvSizer interface {
	Bytes() int64
}

// cacheSizer is a backbone that says what a conversation's cache holds at
// a given length (LFM2-Audio's).
type cacheSizer interface {
	BytesFor(positions int) int64
}

// growableCache is a backbone cache that can be given the memory of a
// whole turn at once (stages/lfm2's Cache takes the turn's KV blocks from
// its pool): the turn's passes then take none.
type growableCache interface {
	Grow(q gpu.Queue, positions int) error
}

// preallocate gives t's cache the blocks of every position the turn may
// reach: the history, the prompt and MaxNewTokens steps (what Start
// admitted against the budget). A pool that cannot give them all (only a
// pool given a limit of its own) leaves the passes to take them as they go.
func (e *Engine) preallocate(c *nn.Ctx, t *turn) {
	if g, ok := t.sess.cache.(growableCache); ok {
		if err := g.Grow(c.Q, t.sess.chat.Len()+t.req.MaxNewTokens); err != nil {
			e.opts.Logger.Warn("backbone: the KV pool cannot preallocate the turn", "err", err)
		}
	}
}

// initMemory sets the budget and learns the sizes the engine charges: a
// cache's bytes per length, a codec stream's state.
func (e *Engine) initMemory() {
	switch b := e.opts.MemoryBudget; {
	case b < 0:
		e.mem.budget = math.MaxInt64
	case b == 0:
		e.mem.budget = DefaultMemoryBudget(e.dev)
	default:
		e.mem.budget = b
	}
	if s, ok := e.m.LM().(cacheSizer); ok {
		e.kvFor = s.BytesFor
	}
	e.codecBytes = e.opts.CodecStateBytes
	if e.codecBytes <= 0 {
		e.codecBytes = measureCodec(e.dev, e.m.AudioCodec(), e.info.Codebooks)
	}
}

// measureCodec returns the device memory one codec stream holds after a
// few frames: the second of two streams (the first warms whatever the
// codec shares between streams). 1 MiB where the device does not count its
// memory.
func measureCodec(dev gpu.Device, c family.Codec, codebooks int) int64 {
	if _, ok := dev.(gpu.Informer); !ok {
		return 1 << 20
	}
	frames := make([][]int, 4)
	for i := range frames {
		frames[i] = make([]int, codebooks)
	}
	var n int64
	for range 2 {
		before := gpu.DescribeDevice(dev).MemUsed
		st := c.NewStream()
		st.DecodeFrames(context.Background(), frames) // zeros are codes; an error leaves the estimate
		n = gpu.DescribeDevice(dev).MemUsed - before
		st.Close()
	}
	return max(n, 64<<10)
}

// rowBytes is the host memory of one history row (its codes aside).
const rowBytes = int64(unsafe.Sizeof(chat.Row{}))

// historyBytes is what a conversation's history holds: its rows, their
// codes and the encoder rows of each clip (once per clip).
func historyBytes(rows []chat.Row) int64 {
	n := int64(len(rows)) * rowBytes
	var last *chat.Clip
	for _, r := range rows {
		n += int64(len(r.Codes)) * 8
		if r.Clip != nil && r.Clip != last {
			last = r.Clip
			if f, ok := r.Clip.Features.([]float32); ok {
				n += int64(len(f)) * 4
			}
		}
	}
	return n
}

// turnCharge is what a turn of s reserves when it starts: the KV cache
// grown to every position the turn may reach, the history's new rows (the
// prompt's, a clip's encoder rows, the reply's), and a codec stream.
func (e *Engine) turnCharge(s *Session, t *turn) bytesOf {
	var r bytesOf
	if e.kvFor != nil {
		r.kv = max(0, e.kvFor(s.chat.Len()+t.req.MaxNewTokens)-s.held.kv)
	}
	r.history = int64(s.chat.Len()-t.chatStart) * rowBytes
	if t.clip != nil {
		r.history += int64(chat.Rows(t.clip.MelFrames)) * int64(e.info.HiddenSize) * 4
	}
	r.history += int64(t.req.MaxNewTokens) * (rowBytes + int64(e.info.Codebooks)*8)
	r.codec = e.codecBytes
	return r
}

// settleMemory replaces t's reservation by what its session holds now.
func (e *Engine) settleMemory(t *turn) {
	s := t.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.held
	s.held = bytesOf{history: historyBytes(s.chat.Rows(0, s.chat.Len()))}
	if k, ok := s.cache.(kvSizer); ok && s.cache != nil {
		s.held.kv = k.Bytes()
	}
	e.mem.move(bytesOf{was.kv + t.charge.kv, was.history + t.charge.history, t.charge.codec}, s.held)
	t.charge = bytesOf{}
}

// MemoryBytes returns what the conversation holds in the engine's memory
// between turns: its KV cache and its history.
func (s *Session) MemoryBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held.sum()
}

// dropMemory gives back what a closed session held (s.mu held).
func (s *Session) dropMemory() {
	if s.e == nil { // a zero Session holds nothing
		return
	}
	s.e.mem.move(s.held, bytesOf{})
	s.held = bytesOf{}
}
