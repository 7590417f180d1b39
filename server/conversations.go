package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/omni-pipe/omni-pipe/pipeline"
)

// conversation is a stored pipeline session.
type conversation struct {
	id    string
	sess  *pipeline.Session
	inUse bool      // a request holds it
	used  time.Time // when the last request let it go
	// held is the context of the request holding it (its turn stops when
	// that ends); freed is closed when that request lets it go.
	held  context.Context
	freed chan struct{}
}

// conversations maps conversation ids to sessions: at most max of them,
// each forgotten (and its cache freed) after ttl without a request. One
// request at a time holds a conversation.
type conversations struct {
	mu   sync.Mutex
	byID map[string]*conversation
	max  int
	ttl  time.Duration
	now  func() time.Time
}

func newConversations(max int, ttl time.Duration) *conversations {
	return &conversations{byID: map[string]*conversation{}, max: max, ttl: ttl, now: time.Now}
}

// acquire holds the conversation id for the request of ctx, or a new one
// made with newSession when id is empty. A conversation held by a request
// whose client has gone is waited for (its cancelled turn ends at the
// engine's next frame), so that a client that hangs up and continues at
// once is not refused as busy; one held by a live request is busy.
func (cs *conversations) acquire(ctx context.Context, id string, newSession func() *pipeline.Session) (*conversation, *apiError) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for {
		c, wait, err := cs.tryAcquireLocked(ctx, id, newSession)
		if wait == nil {
			return c, err
		}
		cs.mu.Unlock()
		select {
		case <-wait:
			cs.mu.Lock()
		case <-ctx.Done():
			cs.mu.Lock()
			return nil, newError(http.StatusServiceUnavailable, typeServer, codeCancelled, "",
				"gave up waiting for the conversation's cancelled turn to end: "+context.Cause(ctx).Error())
		}
	}
}

// tryAcquireLocked is acquire without waiting: it returns the held
// conversation, an error, or a channel that is closed when the cancelled
// request that holds the conversation lets it go.
func (cs *conversations) tryAcquireLocked(ctx context.Context, id string, newSession func() *pipeline.Session) (*conversation, <-chan struct{}, *apiError) {
	now := cs.now()
	if id != "" {
		c, ok := cs.byID[id]
		if ok && !c.inUse && now.Sub(c.used) > cs.ttl {
			cs.dropLocked(c)
			ok = false
		}
		if !ok {
			return nil, nil, newError(http.StatusNotFound, typeInvalidRequest, codeUnknownConversation, "conversation_id",
				"unknown conversation "+quote(id)+" (conversations are forgotten after "+cs.ttl.String()+" without a request, and when the server restarts)")
		}
		if c.inUse {
			if c.held.Err() != nil {
				return nil, c.freed, nil
			}
			return nil, nil, newError(http.StatusConflict, typeInvalidRequest, codeConversationBusy, "conversation_id",
				"conversation "+quote(id)+" already has a turn running; wait for its done event")
		}
		c.hold(ctx)
		return c, nil, nil
	}
	if len(cs.byID) >= cs.max && !cs.evictLocked(now) {
		return nil, nil, newError(http.StatusServiceUnavailable, typeServer, codeTooManyConvs, "",
			"every conversation slot is in use; retry later")
	}
	c := &conversation{id: newID("conv_"), sess: newSession(), used: now}
	c.hold(ctx)
	cs.byID[c.id] = c
	return c, nil, nil
}

// hold marks c held by the request of ctx (cs.mu held).
func (c *conversation) hold(ctx context.Context) {
	c.inUse, c.held, c.freed = true, ctx, make(chan struct{})
}

// release lets c go. A conversation whose first turn never started (keep
// false) is forgotten.
func (cs *conversations) release(c *conversation, keep bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c.inUse, c.held = false, nil
	c.used = cs.now()
	close(c.freed)
	if !keep {
		cs.dropLocked(c)
	}
}

// evictLocked forgets the least recently used idle conversation; it
// reports whether there was one.
func (cs *conversations) evictLocked(now time.Time) bool {
	var oldest *conversation
	for _, c := range cs.byID {
		if !c.inUse && (oldest == nil || c.used.Before(oldest.used)) {
			oldest = c
		}
	}
	if oldest == nil {
		return false
	}
	cs.dropLocked(oldest)
	return true
}

// evictBytes forgets idle conversations, least recently used first, other
// than keep, until they gave back need bytes of the engine's memory; it
// reports whether it forgot any.
func (cs *conversations) evictBytes(need int64, keep *conversation) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var idle []*conversation
	for _, c := range cs.byID {
		if !c.inUse && c != keep {
			idle = append(idle, c)
		}
	}
	slices.SortFunc(idle, func(a, b *conversation) int { return a.used.Compare(b.used) })
	freed, n := int64(0), 0
	for _, c := range idle {
		if freed >= need {
			break
		}
		freed += c.sess.MemoryBytes()
		cs.dropLocked(c)
		n++
	}
	return n > 0
}

// bytes returns the engine memory the stored conversations hold.
func (cs *conversations) bytes() int64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var n int64
	for _, c := range cs.byID {
		n += c.sess.MemoryBytes()
	}
	return n
}

func (cs *conversations) dropLocked(c *conversation) {
	delete(cs.byID, c.id)
	c.sess.Close()
}

// sweep forgets the conversations idle for longer than the ttl and
// returns how many.
func (cs *conversations) sweep() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	now := cs.now()
	n := 0
	for _, c := range cs.byID {
		if !c.inUse && now.Sub(c.used) > cs.ttl {
			cs.dropLocked(c)
			n++
		}
	}
	return n
}

// closeAll forgets every conversation.
func (cs *conversations) closeAll() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.byID {
		cs.dropLocked(c)
	}
}

// count returns the number of stored conversations.
func (cs *conversations) count() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.byID)
}

// newID returns prefix and 24 random hex digits: ids a client cannot guess.
func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return prefix + hex.EncodeToString(b[:])
}

// quote quotes an id from a request for a message, cut short if long.
func quote(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "…"
	}
	return strconv.Quote(s)
}
