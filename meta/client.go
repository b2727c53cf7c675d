package meta

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// Client defaults.
const (
	DefaultCacheEntries   = 1 << 16
	maxCacheEntries       = 1 << 40 // ristretto's sketch has 10 counters per entry
	DefaultCacheTTL       = 30 * time.Second
	DefaultDepth          = 64
	DefaultRPCTimeout     = time.Second
	DefaultConnectTimeout = time.Second
	// DefaultFirstConnectTimeout: see ClientConfig.FirstConnectTimeout.
	DefaultFirstConnectTimeout = 8 * time.Second
	DefaultRetryInterval       = 200 * time.Millisecond
	DefaultQPRetryCnt          = 7
	// ListChunk bounds one READ of List. The default table (2 MiB) is
	// one READ; larger tables are read in several READs posted with one
	// doorbell.
	ListChunk = 16 << 20
)

// ClientConfig configures a Client. Zero fields take the defaults.
type ClientConfig struct {
	// Servers are the meta servers (replicas) to use, in order of
	// preference.
	Servers []netip.AddrPort
	// Service is the servers' connection-manager service.
	Service uint32
	// CacheEntries bounds the DCCache (ristretto, one unit of cost per
	// node); negative disables it. CacheTTL is how long an entry is kept
	// (ristretto's TTL, wall-clock).
	CacheEntries int64
	CacheTTL     time.Duration
	// UseRPC makes Lookup ask the server by RPC instead of READing the
	// table: KRCORE's meta-rpc build, the baseline.
	UseRPC bool
	// Depth is the operations in flight per server connection (at most
	// 1024).
	Depth int
	// RPCTimeout bounds the wait for a reply; ConnectTimeout a
	// connection attempt. FirstConnectTimeout bounds NewClient's attempt
	// when its ctx has a later deadline (a server slow to answer, as when
	// many nodes start at once, then completes the one handshake).
	RPCTimeout, ConnectTimeout, FirstConnectTimeout time.Duration
	// RetryInterval paces reconnection to a server that is down, and is
	// the grain of the client's maintenance: reconnections and keepalive
	// pings happen at ticks RetryInterval apart (it sleeps through the
	// ticks with nothing due). Consecutive failures double it, up to
	// MaxRetryInterval, with jitter (reconnect.go).
	RetryInterval, MaxRetryInterval time.Duration
	// QPTimeout and QPRetryCnt tune the RC QPs; a dead server is noticed
	// after about QPTimeout*(QPRetryCnt+1) on a READ. Zero QPTimeout is
	// RPCTimeout/(QPRetryCnt+1), zero QPRetryCnt DefaultQPRetryCnt: a
	// connection outlives a server that is merely slow (a loaded machine
	// stalls processes for tens of milliseconds, longer than a NIC's
	// default ACK timeout budget) for as long as an RPC would wait.
	QPTimeout  time.Duration
	QPRetryCnt int
	// MaxQPTimeout bounds the ACK timeout of a connection that backed off
	// (its READs waited past QPTimeout: a slow server); zero means
	// RPCTimeout, at least QPTimeout. A connection's QP then fails after
	// at most about QPTimeout*(2^k-1) + MaxQPTimeout*(QPRetryCnt+1-k)
	// without an answer (k doublings; 5.9 s with the defaults) instead of
	// QPTimeout*(QPRetryCnt+1).
	MaxQPTimeout time.Duration
	// Clock paces reconnects and keepalive pings, and Agents' heartbeats,
	// and times RPCs and connection attempts; nil is the device's clock
	// (softnic's: the clock of its ACK timeouts), or the system clock.
	Clock clock.Clock
	// NodeKey, if set, is this node's own key: the client proves it on
	// every connection to a server that supports node keys, and the
	// entries it registers are bound to it (auth.go).
	NodeKey ed25519.PrivateKey
}

func (c *ClientConfig) fill() error {
	if len(c.Servers) == 0 {
		return fmt.Errorf("meta: ClientConfig needs at least one server")
	}
	if c.Service == 0 {
		c.Service = DefaultService
	}
	if c.CacheEntries == 0 {
		c.CacheEntries = DefaultCacheEntries
	}
	if c.CacheEntries > maxCacheEntries {
		return fmt.Errorf("meta: CacheEntries %d > %d", c.CacheEntries, maxCacheEntries)
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	if c.Depth == 0 {
		c.Depth = DefaultDepth
	}
	if c.RPCTimeout == 0 {
		c.RPCTimeout = DefaultRPCTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.FirstConnectTimeout == 0 {
		c.FirstConnectTimeout = max(DefaultFirstConnectTimeout, c.ConnectTimeout)
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.MaxRetryInterval == 0 {
		c.MaxRetryInterval = max(DefaultMaxRetryInterval, c.RetryInterval)
	}
	if c.QPRetryCnt == 0 {
		c.QPRetryCnt = DefaultQPRetryCnt
	}
	if c.QPTimeout == 0 {
		c.QPTimeout = c.RPCTimeout / time.Duration(c.QPRetryCnt+1)
	}
	if c.MaxQPTimeout == 0 {
		c.MaxQPTimeout = c.RPCTimeout
	}
	c.MaxQPTimeout = max(c.MaxQPTimeout, c.QPTimeout)
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Depth < 1 || c.Depth > maxSlots {
		return fmt.Errorf("meta: Depth %d: want 1..%d", c.Depth, maxSlots)
	}
	return nil
}

// ClientStats are a client's counters.
type ClientStats struct {
	Lookups      uint64 // Lookup calls
	CacheMisses  uint64 // Lookups not answered by the DCCache
	Reads        uint64 // table READs completed
	DrivenReads  uint64 // of which the caller received the answer itself (run to completion)
	TornReads    uint64 // READs that found a write in progress and were repeated
	RPCs         uint64 // requests answered
	StrayReplies uint64 // replies that matched no waiting request
	Failovers    uint64 // operations retried on another server
	Rebuilds     uint64 // operations sent again on a new connection after a transport error
	Connects     uint64 // connections made
	Invalidated  uint64 // Invalidate and Stale calls
	// LastKnown counts lookups answered from the last known entry
	// because no meta server was reachable.
	LastKnown uint64
	// MapRetries counts Lists that found the membership map changing
	// under them and read it again.
	MapRetries uint64
	// Backoffs counts doublings of a connection's ACK timeout: READs that
	// waited longer than it (a slow server).
	Backoffs uint64
	// Uncached counts entries read while the DCCache was still being
	// built (a new client's first ~2 ms), which it therefore lacks.
	Uncached uint64
	// Busy counts answers of a busy meta service (a rejected connection
	// request, a registration answered busy) that the client backed off
	// from.
	Busy uint64
}

// Client reads the node table of one or more meta servers and caches
// what it read. It is safe for concurrent use.
type Client struct {
	dev   verbs.Device
	cfg   ClientConfig
	clock clock.Clock
	pd    verbs.PD

	servers []*server // one per configured address; the slice never changes
	pref    atomic.Int32

	// dc is the DCCache; nil when disabled and until built. NewClient
	// builds it in the background (see dcSketchEntries for its cost): a
	// new node's first lookups miss anyway and need not wait for it. An
	// entry read before it is built is not cached (ClientStats.Uncached).
	// dcReady is closed once it is built.
	dc      atomic.Pointer[ristretto.Cache[uint32, NodeInfo]]
	dcReady chan struct{}
	front   dcFront // entries on their way into dc, once dc is built
	// inval counts invalidations: a lookup caches what it read only if
	// no invalidation happened meanwhile.
	inval atomic.Uint64

	// known holds the last entry read of each gid (at most CacheEntries),
	// whatever the DCCache evicted or expired: with every meta server
	// unreachable, Lookup answers from it, so that peers in use keep
	// working while the meta service is down. An entry the data path
	// found stale (Stale) or that a server no longer has is dropped.
	knownMu sync.Mutex
	known   map[uint32]NodeInfo

	// kick wakes maintain (capacity 1): a connection died, or an attempt
	// failed and set a new retryAt.
	kick   chan struct{}
	ctx    context.Context // ends at Close; bounds background work
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	st struct {
		lookups, misses, reads, tornReads, rpcs  atomic.Uint64
		strayReplies, failovers, connects, inval atomic.Uint64
		drivenReads                              atomic.Uint64
		lastKnown, rebuilds, mapRetries          atomic.Uint64
		backoffs, uncached, busy                 atomic.Uint64
	}
}

// server is the client's record of one meta server.
type server struct {
	addr netip.AddrPort

	dialing chan struct{} // a semaphore serializing connection attempts

	mu      sync.Mutex // guards the fields below
	cur     *conn      // nil or dead: down
	gens    uint64     // connections made so far
	lastTry time.Time  // clock time of the last attempt
	lastErr error
	// fails counts consecutive failed attempts; retryAt is when the next
	// may start (reconnect.go).
	fails   int
	retryAt time.Time
	// handshake is how long the last connection that succeeded took to
	// make (client clock): what the server could do then.
	handshake time.Duration

	// spare is kept from an attempt the server rejected, for the next
	// (dialSpare); Close releases it.
	spare spareQP
}

// NewClient makes a client of the meta servers in cfg.Servers on dev. It
// connects to each; it fails only if none answers (ErrUnreachable). It
// keeps trying the others in the background.
func NewClient(ctx context.Context, dev verbs.Device, cfg ClientConfig) (*Client, error) {
	if cfg.Clock == nil {
		cfg.Clock = deviceClock(dev)
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	c := &Client{dev: dev, cfg: cfg, clock: cfg.Clock, pd: pd, done: make(chan struct{}),
		kick: make(chan struct{}, 1), known: make(map[uint32]NodeInfo)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for _, a := range cfg.Servers {
		c.servers = append(c.servers, &server{addr: a, dialing: make(chan struct{}, 1)})
	}
	c.dcReady = make(chan struct{})
	c.front.max = int(min(frontMax, cfg.CacheEntries))
	if cfg.CacheEntries > 0 {
		c.wg.Add(1)
		go c.buildDCCache()
	} else {
		close(c.dcReady)
	}
	// Connect to every server at once; return when one is up, and let
	// the others finish in the background (a dead replica must not hold
	// up a node's start by its connect timeout).
	//
	// Each attempt lasts as long as the caller waits (ctx), not
	// ConnectTimeout: a server that is slow to answer, as when many nodes
	// start at once on a loaded machine, still answers the one handshake
	// (whose request the NIC resends with backoff), where abandoning it
	// after ConnectTimeout and starting another would only add work to
	// what the server has queued. It still ends after FirstConnectTimeout,
	// so that a caller that retries (node.Start) reports a service that
	// is down; a ctx without a deadline gets ConnectTimeout. Both are on
	// the client's clock. A busy server is tried again after a backoff
	// within that time (reconnect.go).
	limit := cfg.ConnectTimeout
	if _, ok := ctx.Deadline(); ok {
		limit = cfg.FirstConnectTimeout
	}
	actx, acancel := clock.WithTimeout(c.ctx, c.clock, limit)
	context.AfterFunc(ctx, acancel)
	results := make(chan error, len(c.servers))
	for _, s := range c.servers {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			var cn *conn
			err := c.whileBusy(actx, func() (err error) {
				cn, err = c.connect(actx, s, true)
				return err
			})
			if err == nil {
				cn.unref()
			}
			results <- err
		}()
	}
	var errs []error
	for len(errs) < len(c.servers) {
		var err error
		select {
		case err = <-results:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err == nil {
			break
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			c.Close()
			return nil, err
		}
	}
	if len(errs) == len(c.servers) {
		c.Close()
		return nil, unreachable(errs)
	}
	c.wg.Add(1)
	go c.maintain(c.clock.Now())
	return c, nil
}

// Close closes the client's connections (telling the servers) and its
// cache. Close Agents first: a closed client cannot deregister them.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.cancel()
		close(c.done)
		c.wg.Wait()
		for _, s := range c.servers {
			s.mu.Lock()
			cn := s.cur
			s.cur = nil
			spare := s.spare
			s.spare = spareQP{}
			s.mu.Unlock()
			if spare.qp != nil {
				spare.qp.Destroy()
				spare.cq.Destroy()
			}
			if cn != nil {
				if cn.ref() {
					ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
					cn.call(ctx, message{kind: kindBye})
					cancel()
					cn.kill()
					cn.unref()
				}
				cn.unref()
			}
		}
		if dc := c.dc.Load(); dc != nil {
			dc.Close()
		}
	})
	return nil
}

// dcSketchEntries is how many entries the DCCache's frequency sketch is
// sized for (ristretto's advice: 10 counters per entry). Ristretto
// consults the sketch only when the cache is full, to choose between a new
// entry and an old one; a DCCache of CacheEntries (default 64 Ki) is full
// only in a cluster larger than that. Sized for all 64 Ki entries, the
// sketch is 2.5 MiB that a fresh process faults in and garbage-collects:
// NewClient took 5.4-9.2 ms instead of 2.2-2.9 ms (6 fresh processes each,
// same run), with the cache built in the background.
const dcSketchEntries = 4096

// newDCCache is ristretto.NewCache; tests hold it up to see a client
// whose DCCache is not built yet.
var newDCCache = ristretto.NewCache[uint32, NodeInfo]

// buildDCCache builds the DCCache (see Client.dc).
func (c *Client) buildDCCache() {
	defer c.wg.Done()
	defer close(c.dcReady)
	dc, err := newDCCache(&ristretto.Config[uint32, NodeInfo]{
		NumCounters:        10 * min(c.cfg.CacheEntries, dcSketchEntries),
		MaxCost:            c.cfg.CacheEntries,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		// ristretto refuses only counts <= 0, which fill rules out.
		panic(fmt.Sprintf("meta: DCCache with %d entries: %v", c.cfg.CacheEntries, err))
	}
	c.dc.Store(dc)
}

func (c *Client) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// live returns s's connection with a reference taken, or nil if it is
// down.
func (s *server) live() *conn {
	s.mu.Lock()
	cn := s.cur
	if cn == nil {
		s.mu.Unlock()
		return nil
	}
	if !cn.ref() {
		// Dead: drop the record's reference so that its resources go
		// once the last operation on it ends.
		s.cur = nil
		s.mu.Unlock()
		cn.unref()
		return nil
	}
	s.mu.Unlock()
	return cn
}

// connect returns s's live connection, or makes one. The caller gets a
// reference.
//
// A connection attempt lasts ConnectTimeout, or, with budget set (a new
// client's first connection), until ctx's deadline: a node that is
// starting has nothing to fall back on, and gains nothing by abandoning a
// handshake that a slow server has not answered yet to start another one,
// which would only queue more work at that server. Later attempts keep
// ConnectTimeout, so that with the service down a lookup fails (or
// answers from the last known entry) within it, not at its deadline. A
// ctx without a deadline gets ConnectTimeout either way.
func (c *Client) connect(ctx context.Context, s *server, budget bool) (*conn, error) {
	if cn := s.live(); cn != nil {
		return cn, nil
	}
	select {
	case s.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.dialing }()
	if cn := s.live(); cn != nil {
		return cn, nil
	}
	if c.closed() {
		return nil, ErrClosed
	}
	if wait := c.busyWait(s); wait > 0 && !budget {
		// The server shed the last attempt (busy) and its backoff ends
		// within a connection attempt's time: wait it out, then try.
		if err := c.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	if s.lastErr != nil && c.clock.Now().Before(s.retryAt) && !budget {
		// It failed a moment ago: fail at once (maintain tries again
		// after the backoff, reconnect.go) rather than make every caller
		// wait for a connect timeout of its own.
		err := s.lastErr
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %v: %w", ErrUnreachable, s.addr, err)
	}
	s.mu.Unlock()
	s.mu.Lock()
	gen := s.gens + 1
	s.lastTry = c.clock.Now()
	start := s.lastTry
	limit := c.reconnectTimeout(s.handshake)
	s.mu.Unlock()
	var cancel context.CancelFunc
	if budget {
		ctx, cancel = context.WithCancel(ctx) // the caller's budget bounds it
	} else {
		ctx, cancel = clock.WithTimeout(ctx, c.clock, limit)
	}
	defer cancel()
	cn, err := c.dialSpare(ctx, s.addr, gen, s)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// An attempt may have lasted the caller's budget: "a moment
		// ago" counts from its end.
		s.lastErr, s.lastTry = err, c.clock.Now()
		s.fails++
		s.retryAt = s.lastTry.Add(c.retryDelay(s.fails))
		c.poke()
		if isBusy(err) {
			err = fmt.Errorf("%w: %w", ErrBusy, err)
		}
		if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w: %v: %w", ErrUnreachable, s.addr, err)
		}
		return nil, err
	}
	if c.closed() {
		// Close may have gone over the servers already: drop it.
		cn.kill()
		cn.unref()
		return nil, ErrClosed
	}
	old := s.cur
	s.cur, s.gens, s.lastErr, s.fails = cn, gen, nil, 0
	s.handshake = c.clock.Now().Sub(start)
	c.st.connects.Add(1)
	cn.ref() // the caller's; the record keeps the dial's
	if old != nil {
		old.unref()
	}
	return cn, nil
}

// reconnectTimeout bounds a connection attempt after the first, given
// how long the last handshake that succeeded took: ConnectTimeout, or
// twice that handshake if longer (a server that needed seconds to answer
// while loaded is not given up on after one), at most
// FirstConnectTimeout.
func (c *Client) reconnectTimeout(last time.Duration) time.Duration {
	return min(max(c.cfg.ConnectTimeout, 2*last), max(c.cfg.FirstConnectTimeout, c.cfg.ConnectTimeout))
}

// maintain reconnects servers that are down and pings idle connections so
// that the servers keep them. It runs until Close.
//
// It looks at the servers at ticks RetryInterval apart from start, but
// sleeps through the ticks at which nothing can be due: the next is the
// first tick at or after a down server's retryAt or a live connection's
// ping time, or the tick after a kick (a connection died, or an attempt
// failed). An idle node then wakes about once per IdleTimeout/3, not five
// times a second, with the same reconnections and pings at the same
// ticks.
func (c *Client) maintain(start time.Time) {
	defer c.wg.Done()
	period := c.cfg.RetryInterval
	// tickAfter is the first tick after now that is at or after due.
	tickAfter := func(now, due time.Time) time.Time {
		if !due.After(now) {
			due = now.Add(1)
		}
		k := (due.Sub(start) + period - 1) / period
		return start.Add(k * period)
	}
	next := start.Add(period)
	for {
		ch, stop := clock.After(c.clock, next.Sub(c.clock.Now()))
		select {
		case <-c.done:
			stop()
			return
		case <-c.kick:
			stop()
			next = tickAfter(c.clock.Now(), c.nextDue())
			continue
		case <-ch:
		}
		ctx := c.ctx
		now := c.clock.Now()
		for _, s := range c.servers {
			cn := s.live()
			if cn == nil {
				s.mu.Lock()
				due := !now.Before(s.retryAt)
				s.mu.Unlock()
				if due {
					if cn, err := c.connect(ctx, s, false); err == nil {
						cn.unref()
					}
				}
				continue
			}
			idle := time.Duration(now.UnixNano() - cn.lastTx.Load())
			if idle >= cn.boot.IdleTimeout/3 {
				_, _ = cn.call(ctx, message{kind: kindPing})
			}
			cn.unref()
		}
		// A kick that came while this went over the servers is seen.
		select {
		case <-c.kick:
		default:
		}
		next = tickAfter(c.clock.Now(), c.nextDue())
	}
}

// nextDue returns when maintain next has something to do: the earliest
// retryAt of a down server (the zero time if it never failed: at once)
// and ping time of a live connection.
func (c *Client) nextDue() time.Time {
	var due time.Time
	for i, s := range c.servers {
		var at time.Time
		if cn := s.live(); cn != nil {
			at = time.Unix(0, cn.lastTx.Load()+int64(cn.boot.IdleTimeout/3))
			cn.unref()
		} else {
			s.mu.Lock()
			at = s.retryAt
			s.mu.Unlock()
		}
		if i == 0 || at.Before(due) {
			due = at
		}
	}
	return due
}

// poke wakes maintain to look at when it is next due.
func (c *Client) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Stats returns the client's counters.
func (c *Client) Stats() ClientStats {
	return ClientStats{
		Lookups:      c.st.lookups.Load(),
		CacheMisses:  c.st.misses.Load(),
		Reads:        c.st.reads.Load(),
		DrivenReads:  c.st.drivenReads.Load(),
		TornReads:    c.st.tornReads.Load(),
		RPCs:         c.st.rpcs.Load(),
		StrayReplies: c.st.strayReplies.Load(),
		Failovers:    c.st.failovers.Load(),
		Rebuilds:     c.st.rebuilds.Load(),
		Connects:     c.st.connects.Load(),
		Invalidated:  c.st.inval.Load(),
		LastKnown:    c.st.lastKnown.Load(),
		MapRetries:   c.st.mapRetries.Load(),
		Backoffs:     c.st.backoffs.Load(),
		Uncached:     c.st.uncached.Load(),
		Busy:         c.st.busy.Load(),
	}
}
