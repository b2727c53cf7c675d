package meta

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"sort"
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
	// how often the client checks whether a connection needs a ping.
	RetryInterval time.Duration
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
	// Clock paces reconnects and keepalive pings, and Agents' heartbeats;
	// nil is the system clock.
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

	tick   *clock.Ticker
	ctx    context.Context // ends at Close; bounds background work
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	st struct {
		lookups, misses, reads, tornReads, rpcs  atomic.Uint64
		strayReplies, failovers, connects, inval atomic.Uint64
		lastKnown, rebuilds, mapRetries          atomic.Uint64
		backoffs, uncached                       atomic.Uint64
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
	// handshake is how long the last connection that succeeded took to
	// make (client clock): what the server could do then.
	handshake time.Duration
}

// NewClient makes a client of the meta servers in cfg.Servers on dev. It
// connects to each; it fails only if none answers (ErrUnreachable). It
// keeps trying the others in the background.
func NewClient(ctx context.Context, dev verbs.Device, cfg ClientConfig) (*Client, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	c := &Client{dev: dev, cfg: cfg, clock: cfg.Clock, pd: pd, done: make(chan struct{}),
		known: make(map[uint32]NodeInfo)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for _, a := range cfg.Servers {
		c.servers = append(c.servers, &server{addr: a, dialing: make(chan struct{}, 1)})
	}
	c.dcReady = make(chan struct{})
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
	// is down; a ctx without a deadline gets ConnectTimeout.
	actx, acancel := context.WithCancel(c.ctx)
	if dl, ok := ctx.Deadline(); ok {
		if end := time.Now().Add(cfg.FirstConnectTimeout); end.Before(dl) {
			dl = end
		}
		actx, acancel = context.WithDeadline(c.ctx, dl)
	}
	context.AfterFunc(ctx, acancel)
	results := make(chan error, len(c.servers))
	for _, s := range c.servers {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			cn, err := c.connect(actx, s, true)
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
	c.tick = clock.NewTicker(c.clock, cfg.RetryInterval)
	c.wg.Add(1)
	go c.maintain()
	return c, nil
}

// Close closes the client's connections (telling the servers) and its
// cache. Close Agents first: a closed client cannot deregister them.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.cancel()
		close(c.done)
		if c.tick != nil {
			c.tick.Stop()
		}
		c.wg.Wait()
		for _, s := range c.servers {
			s.mu.Lock()
			cn := s.cur
			s.cur = nil
			s.mu.Unlock()
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
	s.mu.Lock()
	if s.lastErr != nil && c.clock.Now().Sub(s.lastTry) < c.cfg.RetryInterval {
		// It failed a moment ago: fail at once (maintain tries again
		// every RetryInterval) rather than make every caller wait for a
		// connect timeout of its own.
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
	if _, ok := ctx.Deadline(); budget && ok {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeout(ctx, limit)
	}
	defer cancel()
	cn, err := c.dial(ctx, s.addr, gen)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// An attempt may have lasted the caller's budget: "a moment
		// ago" counts from its end.
		s.lastErr, s.lastTry = err, c.clock.Now()
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
	s.cur, s.gens, s.lastErr = cn, gen, nil
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
func (c *Client) maintain() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-c.tick.C:
		}
		ctx := c.ctx
		now := c.clock.Now()
		for _, s := range c.servers {
			cn := s.live()
			if cn == nil {
				s.mu.Lock()
				due := now.Sub(s.lastTry) >= c.cfg.RetryInterval
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
	}
}

// MaxRebuilds bounds how many times one operation is sent again on a new
// connection to the same server after its connection failed under it.
const MaxRebuilds = 4

// onServer runs op on cn, a connection to one server that the caller
// holds a reference to. If op fails because the connection died under it
// (a transport error: its QP went to ERR, say a SEND that ran out of
// retries while a host was starved of CPU), the client connects to the
// same server again, which rebuilds the QP, and runs op on the new
// connection, while ctx lasts and at most MaxRebuilds times. Other errors
// (a status from the server, an RPC timeout, ctx's end, a server that
// cannot be reached at all) are returned as they are.
//
// op must be safe to repeat, because the server may have executed the
// request whose reply was lost: a lookup, a heartbeat, a deregistration
// and a registration of a given incarnation are (a registration that
// asks for a gid gets the gid it was assigned before, see
// registry.register).
func (c *Client) onServer(ctx context.Context, cn *conn, op func(cn *conn) error) error {
	err := op(cn)
	s := c.servers[c.index(cn)]
	var rebuilt *conn // ours to unref
	defer func() {
		if rebuilt != nil {
			rebuilt.unref()
		}
	}()
	for try := 0; err != nil && cn.isDead() && try < MaxRebuilds && ctx.Err() == nil && !c.closed(); try++ {
		ncn, cerr := c.connect(ctx, s, false)
		if cerr != nil {
			break
		}
		if rebuilt != nil {
			rebuilt.unref()
		}
		rebuilt, cn = ncn, ncn
		c.st.rebuilds.Add(1)
		err = op(cn)
	}
	return err
}

// each runs f on live connections in order of preference until f
// reports done. If every live connection failed (or none was live), it
// connects to each server again (a restarted server, say) and tries
// those. It returns f's last error, or ErrUnreachable.
func (c *Client) each(ctx context.Context, f func(cn *conn) (done bool, err error)) error {
	if c.closed() {
		return ErrClosed
	}
	var last error
	tried := 0
	for pass := range 2 {
		var cns []*conn
		if pass == 0 {
			cns = c.liveConns()
		} else {
			var err error
			if cns, err = c.connectAll(ctx); len(cns) == 0 {
				last = err
			}
		}
		failed := false
		for i, cn := range cns {
			if tried > 0 {
				c.st.failovers.Add(1)
			}
			tried++
			done, err := f(cn)
			if done {
				for _, cn := range cns[i:] {
					cn.unref()
				}
				if err == nil {
					c.pref.Store(int32(c.index(cn)))
				}
				return err
			}
			cn.unref()
			if err != nil {
				failed = true
				last = err
				if ctx.Err() != nil {
					for _, cn := range cns[i+1:] {
						cn.unref()
					}
					return ctx.Err()
				}
			}
		}
		if len(cns) > 0 && !failed {
			break // every server answered; none had it
		}
	}
	switch {
	case last == nil:
		last = ErrUnreachable
	case errors.Is(last, context.Canceled) || errors.Is(last, context.DeadlineExceeded):
	case !errors.As(last, new(*Error)):
		// A connection request that timed out, a QP that failed: the
		// server is unreachable, and the error says so (and carries an
		// errno) whatever the verbs layer called it.
		last = fmt.Errorf("%w: %w", ErrUnreachable, last)
	}
	return last
}

// connectAll connects to every server that is down, all at once, and
// returns the live connections (with references) once every attempt
// ended, with the last connection error.
func (c *Client) connectAll(ctx context.Context) ([]*conn, error) {
	type result struct {
		cn  *conn
		err error
	}
	res := make([]result, len(c.servers))
	var wg sync.WaitGroup
	for i, s := range c.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].cn, res[i].err = c.connect(ctx, s, false)
		}()
	}
	wg.Wait()
	var out []*conn
	var last error
	for _, r := range res {
		if r.err != nil {
			last = r.err
		} else {
			out = append(out, r.cn)
		}
	}
	return out, last
}

// liveConns returns the live connections in order of preference, with
// references.
func (c *Client) liveConns() []*conn {
	var out []*conn
	p := int(c.pref.Load())
	for i := range c.servers {
		if cn := c.servers[(p+i)%len(c.servers)].live(); cn != nil {
			out = append(out, cn)
		}
	}
	return out
}

func (c *Client) index(cn *conn) int {
	for i, s := range c.servers {
		if s.addr == cn.addr {
			return i
		}
	}
	return 0
}

// Lookup returns gid's node: from the DCCache if there, otherwise with one
// READ of the table (or, with UseRPC, one RPC) at the first live server,
// going on to the others if a server fails or does not know gid.
func (c *Client) Lookup(ctx context.Context, gid uint32) (NodeInfo, error) {
	c.st.lookups.Add(1)
	if dc := c.dc.Load(); dc != nil {
		if n, ok := dc.Get(gid); ok {
			return n, nil
		}
	}
	c.st.misses.Add(1)
	n, err := c.fetch(ctx, gid)
	if err != nil && !errors.Is(err, ErrNotFound) {
		c.knownMu.Lock()
		k, ok := c.known[gid]
		c.knownMu.Unlock()
		if ok {
			c.st.lastKnown.Add(1)
			return k, nil
		}
	}
	return n, err
}

// fetch reads gid from a server and caches it.
func (c *Client) fetch(ctx context.Context, gid uint32) (NodeInfo, error) {
	if gid == 0 {
		return NodeInfo{}, fmt.Errorf("%w: gid 0", ErrNotFound)
	}
	epoch := c.inval.Load()
	if !c.cfg.UseRPC {
		// The common case first: the preferred server answers.
		if cn := c.servers[c.pref.Load()].live(); cn != nil {
			var n NodeInfo
			var found bool
			err := c.onServer(ctx, cn, func(cn *conn) error {
				var err error
				n, found, err = cn.lookup(ctx, gid)
				return err
			})
			cn.unref()
			if err == nil && found {
				c.store(n, epoch)
				return n, nil
			}
			if err != nil {
				c.st.failovers.Add(1) // the others are tried below
			}
		}
	}
	var n NodeInfo
	notFound := false
	err := c.each(ctx, func(cn *conn) (bool, error) {
		var found bool
		err := c.onServer(ctx, cn, func(cn *conn) error {
			var err error
			if c.cfg.UseRPC {
				n, found, err = cn.lookupRPC(ctx, gid)
			} else {
				n, found, err = cn.lookup(ctx, gid)
			}
			return err
		})
		if err != nil {
			return false, err
		}
		if !found {
			notFound = true
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if notFound && ctx.Err() == nil {
			c.forget(gid)
			return NodeInfo{}, fmt.Errorf("%w: gid %d", ErrNotFound, gid)
		}
		return NodeInfo{}, fmt.Errorf("meta: lookup %d: %w", gid, err)
	}
	c.store(n, epoch)
	return n, nil
}

func (c *Client) store(n NodeInfo, epoch uint64) {
	if c.inval.Load() != epoch {
		return
	}
	if dc := c.dc.Load(); dc != nil {
		dc.SetWithTTL(n.GID, n, 1, c.cfg.CacheTTL)
	} else if c.cfg.CacheEntries > 0 {
		c.st.uncached.Add(1)
	}
	c.knownMu.Lock()
	if _, ok := c.known[n.GID]; ok || int64(len(c.known)) < max(c.cfg.CacheEntries, DefaultCacheEntries) {
		c.known[n.GID] = n
	}
	c.knownMu.Unlock()
}

// forget drops gid's last known entry.
func (c *Client) forget(gid uint32) {
	c.knownMu.Lock()
	delete(c.known, gid)
	c.knownMu.Unlock()
}

// LookupRPC asks a server for gid by RPC, bypassing the cache and the
// table: the baseline the one-sided path is measured against.
func (c *Client) LookupRPC(ctx context.Context, gid uint32) (NodeInfo, error) {
	var n NodeInfo
	notFound := false
	err := c.each(ctx, func(cn *conn) (bool, error) {
		var found bool
		err := c.onServer(ctx, cn, func(cn *conn) error {
			var err error
			n, found, err = cn.lookupRPC(ctx, gid)
			return err
		})
		if err != nil {
			return false, err
		}
		notFound = notFound || !found
		return found, nil
	})
	if err != nil {
		if notFound && ctx.Err() == nil {
			return NodeInfo{}, fmt.Errorf("%w: gid %d", ErrNotFound, gid)
		}
		return NodeInfo{}, fmt.Errorf("meta: lookup %d by RPC: %w", gid, err)
	}
	return n, nil
}

func (cn *conn) lookupRPC(ctx context.Context, gid uint32) (NodeInfo, bool, error) {
	rep, err := cn.call(ctx, message{kind: kindLookup, node: NodeInfo{GID: gid}})
	if err != nil {
		return NodeInfo{}, false, err
	}
	switch rep.status {
	case stOK:
		return rep.node, true, nil
	case stNotFound:
		return NodeInfo{}, false, nil
	}
	return NodeInfo{}, false, rep.status.err()
}

// LookupMany looks up several gids: cached ones from the DCCache; if the
// misses would take more READs than the table is worth, it READs the
// whole table once, otherwise one neighbourhood per miss. Gids that no
// server knows are absent from the result.
func (c *Client) LookupMany(ctx context.Context, gids []uint32) (map[uint32]NodeInfo, error) {
	out := make(map[uint32]NodeInfo, len(gids))
	var miss []uint32
	for _, g := range gids {
		c.st.lookups.Add(1)
		if dc := c.dc.Load(); dc != nil {
			if n, ok := dc.Get(g); ok {
				out[g] = n
				continue
			}
		}
		c.st.misses.Add(1)
		miss = append(miss, g)
	}
	if len(miss) == 0 {
		return out, nil
	}
	if c.cfg.UseRPC || !c.tableCheaper(len(miss)) {
		for _, g := range miss {
			n, err := c.fetch(ctx, g)
			switch {
			case err == nil:
				out[g] = n
			case !errors.Is(err, ErrNotFound):
				return out, err
			}
		}
		return out, nil
	}
	all, err := c.list(ctx)
	if err != nil {
		return out, err
	}
	want := make(map[uint32]bool, len(miss))
	for _, g := range miss {
		want[g] = true
	}
	for _, n := range all {
		if want[n.GID] {
			out[n.GID] = n
		}
	}
	return out, nil
}

// tableCheaper reports whether one READ of the whole table moves fewer
// bytes than k neighbourhood READs.
func (c *Client) tableCheaper(k int) bool {
	cn := c.anyLive()
	if cn == nil {
		return false
	}
	defer cn.unref()
	return k*cn.geom.nbhdBytes() >= int(cn.boot.TableLen)
}

func (c *Client) anyLive() *conn {
	for _, s := range c.servers {
		if cn := s.live(); cn != nil {
			return cn
		}
	}
	return nil
}

// List returns every registered node, sorted by gid, from one READ of a
// server's whole table (several READs in one doorbell for tables larger
// than ListChunk), and caches them all: the full-mesh bootstrap. Slots
// the READ caught in the middle of a write are read again one by one.
func (c *Client) List(ctx context.Context) ([]NodeInfo, error) {
	return c.list(ctx)
}

func (c *Client) list(ctx context.Context) ([]NodeInfo, error) {
	epoch := c.inval.Load()
	var all []NodeInfo
	err := c.each(ctx, func(cn *conn) (bool, error) {
		err := c.onServer(ctx, cn, func(cn *conn) error {
			var err error
			all, err = cn.list(ctx)
			return err
		})
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("meta: list: %w", err)
	}
	for _, n := range all {
		c.store(n, epoch)
	}
	return all, nil
}

// Invalidate drops gid from the DCCache.
func (c *Client) Invalidate(gid uint32) {
	c.inval.Add(1)
	c.st.inval.Add(1)
	if dc := c.dc.Load(); dc != nil {
		dc.Del(gid)
	}
}

// Stale is the data path's hook: failed is the metadata a work request
// just failed with, with a reason for which StaleReason is true (a DC key
// NAK or an unknown DCT: the peer restarted). Stale drops the cached
// entry and reads the table again. It returns the node's current entry if
// it differs from failed, ErrStale if the table still holds failed (the
// peer has not registered again yet; nothing is cached then), or
// ErrNotFound if the node is gone.
func (c *Client) Stale(ctx context.Context, failed NodeInfo) (NodeInfo, error) {
	c.Invalidate(failed.GID)
	c.forget(failed.GID)
	n, err := c.fetch(ctx, failed.GID)
	if err != nil {
		return n, err
	}
	if n == failed {
		c.Invalidate(failed.GID)
		return n, fmt.Errorf("%w: gid %d incarnation %#x", ErrStale, n.GID, n.Incarnation)
	}
	return n, nil
}

// StaleReason reports whether a work completion's reason means the
// peer's DC metadata is stale: its DCT rejected the DC key, or the DCT
// number no longer exists. Both happen when the peer restarted.
func StaleReason(r verbs.Reason) bool {
	return r == verbs.ReasonDCKey || r == verbs.ReasonNoQP
}

// Stats returns the client's counters.
func (c *Client) Stats() ClientStats {
	return ClientStats{
		Lookups:      c.st.lookups.Load(),
		CacheMisses:  c.st.misses.Load(),
		Reads:        c.st.reads.Load(),
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
	}
}

// ServerStatus describes one configured server as the client sees it.
type ServerStatus struct {
	Addr      netip.AddrPort
	Up        bool
	Bootstrap Bootstrap // of the current connection, when up
	LastErr   error     // of the last failed connection attempt
}

// Servers reports the state of each configured server.
func (c *Client) Servers() []ServerStatus {
	out := make([]ServerStatus, len(c.servers))
	for i, s := range c.servers {
		out[i].Addr = s.addr
		if cn := s.live(); cn != nil {
			out[i].Up, out[i].Bootstrap = true, cn.boot
			cn.unref()
		}
		s.mu.Lock()
		out[i].LastErr = s.lastErr
		s.mu.Unlock()
	}
	return out
}

func sortNodes(ns []NodeInfo) {
	sort.Slice(ns, func(i, j int) bool { return ns[i].GID < ns[j].GID })
}

// unreachable joins the errors of servers that did not answer into one
// that wraps ErrUnreachable, saying "unreachable" once.
func unreachable(errs []error) error {
	if len(errs) == 0 {
		return fmt.Errorf("%w: no server to ask", ErrUnreachable)
	}
	for _, err := range errs {
		if !errors.Is(err, ErrUnreachable) {
			return fmt.Errorf("%w: %w", ErrUnreachable, errors.Join(errs...))
		}
	}
	return errors.Join(errs...)
}
