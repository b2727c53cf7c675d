package meta

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/krfs/krfs/clock"
)

// AgentConfig configures an Agent.
type AgentConfig struct {
	// Lease is the lease to ask for; zero takes the server's default.
	// The agent renews at a third of the lease granted.
	Lease time.Duration
	// Clock drives heartbeats; nil takes the client's.
	Clock clock.Clock
}

// Agent keeps one node registered with every meta server of a Client: it
// registers, renews the lease by heartbeat, registers again when a server
// lost the registration (its lease expired, or the server restarted), and
// deregisters on Close. Each server is handled by its own goroutine, so a
// server that is down delays no other.
type Agent struct {
	c     *Client
	cfg   AgentConfig
	clock clock.Clock

	mu   sync.Mutex // guards info and per
	info NodeInfo
	per  []agentServer

	ctx    context.Context // ends at Close or at the client's Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// agentServer is the agent's state at one server.
type agentServer struct {
	registered bool
	serverInc  uint64        // the server incarnation registered with
	lease      time.Duration // granted
	renewed    time.Time     // clock time of the last successful renewal
	err        error         // the last failure
}

// AgentStatus is an agent's state at one server.
type AgentStatus struct {
	Addr       netip.AddrPort
	Registered bool
	Lease      time.Duration
	Renewed    time.Time // clock time of the last registration or heartbeat
	Err        error     // the last failure, if the latest attempt failed
}

// Register registers info with the client's meta servers and keeps it
// registered until the Agent is closed. A zero info.GID asks for an
// assigned gid, a zero info.Incarnation gets a random one (a daemon that
// starts makes a new Agent, so a new incarnation). It fails with
// ErrGIDInUse if a server holds the gid for a live node of another
// incarnation, and with ErrUnreachable if no server answered; servers
// that are down are registered with later, in the background.
//
// With replicas an assigned gid comes from the first server that
// answers and is then registered explicitly with the others; if one of
// them gave the same gid to another node, the agent takes a new one.
func (c *Client) Register(ctx context.Context, info NodeInfo, cfg AgentConfig) (*Agent, error) {
	if !validAddr(info.Addr) {
		return nil, fmt.Errorf("meta: register: node address %v", info.Addr)
	}
	if !validTransport(info.Transport) {
		return nil, fmt.Errorf("meta: register: transport name %q: want at most %d printable bytes", info.Transport, MaxTransport)
	}
	if cfg.Clock == nil {
		cfg.Clock = c.clock
	}
	for info.Incarnation == 0 {
		info.Incarnation = rand.Uint64()
	}
	a := &Agent{c: c, cfg: cfg, clock: cfg.Clock, per: make([]agentServer, len(c.servers))}
	assign := info.GID == 0
	var err error
	for try := 0; ; try++ {
		a.info = info
		err = a.registerAll(ctx, assign)
		if !errors.Is(err, ErrGIDInUse) || !assign || try == 2 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	a.ctx, a.cancel = context.WithCancel(c.ctx)
	for i := range c.servers {
		a.wg.Add(1)
		go a.run(i)
	}
	return a, nil
}

// registerAll registers a.info with every server that is up (servers
// that are down are left to the agent's goroutines), getting a gid first
// if assign. On ErrGIDInUse it undoes the registrations it made.
func (a *Agent) registerAll(ctx context.Context, assign bool) error {
	c := a.c
	cns := c.liveConns()
	if len(cns) == 0 {
		cns, _ = c.connectAll(ctx)
	}
	defer func() {
		for _, cn := range cns {
			cn.unref()
		}
	}()
	ok := 0
	var errs []error
	for _, cn := range cns {
		i := c.index(cn)
		if assign && ok == 0 {
			a.mu.Lock()
			a.info.GID = 0
			a.mu.Unlock()
		}
		err := a.register(ctx, cn, i)
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrGIDInUse) || errors.Is(err, ErrDenied):
			a.deregisterAll(ctx)
			return err
		default:
			errs = append(errs, fmt.Errorf("%v: %w", cn.addr, err))
		}
	}
	if ok == 0 {
		return unreachable(errs)
	}
	return nil
}

// register registers a.info with server i over cn.
func (a *Agent) register(ctx context.Context, cn *conn, i int) error {
	a.mu.Lock()
	info := a.info
	a.mu.Unlock()
	var rep message
	boot := cn.boot
	err := a.c.onServer(ctx, cn, func(cn *conn) error {
		var err error
		rep, err = cn.call(ctx, message{kind: kindRegister, node: info, leaseMs: uint32(a.cfg.Lease / time.Millisecond)})
		boot = cn.boot
		return err
	})
	if err == nil {
		err = rep.status.err()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &a.per[i]
	if err != nil {
		st.err = err
		return err
	}
	if a.info.GID == 0 {
		a.info.GID = rep.node.GID
	}
	*st = agentServer{registered: true, serverInc: boot.ServerIncarnation,
		lease: time.Duration(rep.leaseMs) * time.Millisecond, renewed: a.clock.Now()}
	return nil
}

// heartbeat renews the lease at server i over cn.
func (a *Agent) heartbeat(ctx context.Context, cn *conn, i int) error {
	a.mu.Lock()
	info := a.info
	a.mu.Unlock()
	var rep message
	err := a.c.onServer(ctx, cn, func(cn *conn) error {
		var err error
		rep, err = cn.call(ctx, message{kind: kindHeartbeat, node: NodeInfo{GID: info.GID, Incarnation: info.Incarnation}})
		return err
	})
	if err == nil {
		err = rep.status.err()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := &a.per[i]
	if err != nil {
		st.err = err
		if errors.Is(err, ErrNotRegistered) || errors.Is(err, ErrGIDInUse) {
			st.registered = false
		}
		return err
	}
	st.lease = time.Duration(rep.leaseMs) * time.Millisecond
	st.renewed, st.err = a.clock.Now(), nil
	return nil
}

// run keeps the registration at server i alive until Close.
func (a *Agent) run(i int) {
	defer a.wg.Done()
	if !a.status(i).Registered {
		a.maintain(a.ctx, i) // a server that was down at Register
	}
	period := a.period(i)
	t := clock.NewTicker(a.clock, period)
	defer func() { t.Stop() }()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		a.maintain(a.ctx, i)
		if p := a.period(i); p != period {
			t.Stop()
			period = p
			t = clock.NewTicker(a.clock, period)
		}
	}
}

// period is the heartbeat interval for server i: a third of its lease.
func (a *Agent) period(i int) time.Duration {
	a.mu.Lock()
	l := a.per[i].lease
	a.mu.Unlock()
	if l == 0 {
		l = a.cfg.Lease
	}
	if l == 0 {
		l = DefaultLease
	}
	return max(l/3, time.Millisecond)
}

// maintain makes one renewal attempt at server i: connect if needed,
// register if the server does not hold the registration (never did,
// lost it, or restarted since), heartbeat otherwise.
//
// The attempt lasts at most one heartbeat period (on the client's clock),
// whatever a slow server makes the RPC and reconnection timeouts: the
// server renews the lease when a heartbeat arrives, not when its reply
// does, so a registration stays alive by heartbeats sent on time, and an
// agent blocked on one late reply for longer than the lease (the RPC
// timeout grows with a connection's ACK timeout) would lose it.
func (a *Agent) maintain(ctx context.Context, i int) {
	ctx, cancel := clock.WithTimeout(ctx, a.clock, a.period(i))
	defer cancel()
	c := a.c
	cn, err := c.connect(ctx, c.servers[i], false)
	if err != nil {
		a.mu.Lock()
		a.per[i].err = err
		a.mu.Unlock()
		return
	}
	defer cn.unref()
	a.mu.Lock()
	st := a.per[i]
	a.mu.Unlock()
	if st.registered && st.serverInc == cn.boot.ServerIncarnation {
		err := a.heartbeat(ctx, cn, i)
		if !errors.Is(err, ErrNotRegistered) {
			return
		}
	}
	_ = a.register(ctx, cn, i)
}

// Update publishes new metadata for the registered node (its gid and
// incarnation stay): for example the default region's rkey and length
// once it is exported. Every server that is up gets it now; the others
// when the agent registers with them again.
func (a *Agent) Update(ctx context.Context, info NodeInfo) error {
	if !validAddr(info.Addr) || !validTransport(info.Transport) {
		return fmt.Errorf("meta: update: address %v or transport %q not storable", info.Addr, info.Transport)
	}
	a.mu.Lock()
	info.GID, info.Incarnation = a.info.GID, a.info.Incarnation
	a.info = info
	a.mu.Unlock()
	c := a.c
	cns := c.liveConns()
	if len(cns) == 0 {
		return fmt.Errorf("%w: update of gid %d left to re-registration", ErrUnreachable, info.GID)
	}
	var errs []error
	for _, cn := range cns {
		if err := a.register(ctx, cn, c.index(cn)); err != nil {
			errs = append(errs, fmt.Errorf("%v: %w", cn.addr, err))
		}
		cn.unref()
	}
	return errors.Join(errs...)
}

// Info returns the registered node, with its gid and incarnation.
func (a *Agent) Info() NodeInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.info
}

func (a *Agent) status(i int) AgentStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.per[i]
	return AgentStatus{Addr: a.c.servers[i].addr, Registered: st.registered, Lease: st.lease, Renewed: st.renewed, Err: st.err}
}

// Status reports the agent's state at each server.
func (a *Agent) Status() []AgentStatus {
	out := make([]AgentStatus, len(a.per))
	for i := range out {
		out[i] = a.status(i)
	}
	return out
}

// Close stops renewing and deregisters from every server that holds the
// registration (best effort, each bounded by the RPC timeout).
func (a *Agent) Close() error {
	a.once.Do(func() {
		a.cancel()
		a.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), a.c.cfg.RPCTimeout)
		defer cancel()
		a.deregisterAll(ctx)
	})
	return nil
}

// crash stops the agent without deregistering, as a killed daemon would.
func (a *Agent) crash() {
	a.once.Do(func() {
		a.cancel()
		a.wg.Wait()
	})
}

func (a *Agent) deregisterAll(ctx context.Context) {
	a.mu.Lock()
	info := a.info
	a.mu.Unlock()
	for i, s := range a.c.servers {
		if !a.status(i).Registered {
			continue
		}
		if cn := s.live(); cn != nil {
			_ = a.c.onServer(ctx, cn, func(cn *conn) error {
				_, err := cn.call(ctx, message{kind: kindDeregister, node: NodeInfo{GID: info.GID, Incarnation: info.Incarnation}})
				return err
			})
			cn.unref()
		}
		a.mu.Lock()
		a.per[i].registered = false
		a.mu.Unlock()
	}
}
