package fs

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlineWindow is how long one shared deadline context is handed out:
// an operation on the data path is bounded by Options.Timeout plus at most
// this much.
const deadlineWindow = 100 * time.Millisecond

// deadlines hands out the contexts of the data path (read, write, atomics,
// port writes): one context.WithDeadline per window of deadlineWindow,
// shared by every operation that starts in it, so that an operation costs
// no runtime timer and no allocation. context.WithTimeout per FUSE
// request cost 0.5-0.7 us and 4 allocations; it is only a backstop, since
// qpcore ends every operation within PeerTimeout. The window's context
// expires timeout+deadlineWindow after the window opened, so an operation
// that starts in it is bounded by between timeout and
// timeout+deadlineWindow.
//
// Rare operations (open, getattr, lookup, directory listings) keep their
// own context (mount.ctx): they need the request's values.
type deadlines struct {
	timeout time.Duration
	now     func() time.Time

	cur atomic.Pointer[deadlineCtx] // the open window; nil before the first
	mu  sync.Mutex                  // serializes opening a window
}

// deadlineCtx is one window's context.
type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // called by close; else the deadline releases it
	until  time.Time          // operations starting before until use ctx
}

// get returns the context of an operation starting now.
func (d *deadlines) get() context.Context {
	now := d.now()
	if w := d.cur.Load(); w != nil && now.Before(w.until) {
		return w.ctx
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.cur.Load(); w != nil && now.Before(w.until) {
		return w.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(d.timeout+deadlineWindow))
	d.cur.Store(&deadlineCtx{ctx: ctx, cancel: cancel, until: now.Add(deadlineWindow)})
	return ctx
}

// close cancels the open window's context (earlier ones expire by their
// deadline): operations still running on it end.
func (d *deadlines) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.cur.Swap(nil); w != nil {
		w.cancel()
	}
}
