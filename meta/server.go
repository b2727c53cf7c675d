package meta

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs"
)

// Server defaults.
const (
	DefaultSlots        = 1 << 15 // 16384 nodes at load 1/2
	DefaultNeighborhood = 16      // one lookup READs 2 KiB (16 x EntrySize): two packets across a 1500-byte MTU
	// DefaultLease: a registration lives 10 s without a heartbeat (one
	// every 3.3 s). At 3 s, daemons starved of CPU (64 daemons and 64 new
	// processes on 2 vCPUs, load 50-90) missed it, and their entries left
	// the table while the meta service itself kept up ("no such node").
	DefaultLease       = 10 * time.Second
	DefaultMinLease    = 50 * time.Millisecond
	DefaultMaxLease    = time.Minute
	DefaultIdleTimeout = 30 * time.Second
	DefaultMaxConns    = 4096
	// connQPTimeout is the ACK timeout of the server's side of a client
	// connection: with DefaultQPRetryCnt retries, about a second.
	connQPTimeout = DefaultRPCTimeout / (DefaultQPRetryCnt + 1)
	// DefaultMaxConnsPerSource bounds the connections of one source IP.
	DefaultMaxConnsPerSource = 256
	DefaultRecvDepth         = 1024
	// DefaultFirstAssignedGID is where assigned gids start, leaving the
	// gids below to nodes that choose their own.
	DefaultFirstAssignedGID = 1 << 20

	// writeGroup bounds the table WRITEs posted in one doorbell.
	writeGroup = 1024
	// loopDepth is the loopback QP's send queue depth.
	loopDepth = 4 * writeGroup
	// connSendDepth is the send queue of a server-side client QP.
	connSendDepth = 256
)

// ServerConfig configures a meta server. Zero fields take the defaults.
type ServerConfig struct {
	// Service is the connection-manager service clients connect to.
	Service uint32
	// Slots is the number of home slots of the table (a power of two).
	// Keep the load (nodes / Slots) at or below about 1/2: past roughly
	// 0.7 a registration may find no slot within its neighbourhood
	// (ErrTableFull).
	Slots int
	// Neighborhood is H, the slots one lookup READ covers (1..64).
	Neighborhood int
	// Lease is granted to registrations that ask for none; requests are
	// clamped to [MinLease, MaxLease].
	Lease, MinLease, MaxLease time.Duration
	// SweepInterval is how often expired leases are removed from the
	// table; zero means Lease/10 (at least 10 ms). Requests also check
	// expiry, so a late heartbeat never revives a dead lease.
	SweepInterval time.Duration
	// FirstAssignedGID is the first gid the server assigns.
	FirstAssignedGID uint32
	// IdleTimeout reclaims client connections that sent nothing for that
	// long (clients ping at a third of it).
	IdleTimeout time.Duration
	// MaxConns bounds client connections; more are refused.
	MaxConns int
	// MaxConnsPerSource bounds the client connections from one source IP
	// address, so that one host cannot fill the MaxConns.
	MaxConnsPerSource int
	// HalfOpenTimeout reclaims a connection whose client has sent no
	// message within that time of connecting (connection floods); zero
	// means IdleTimeout/2, which a live client always beats since it pings
	// at IdleTimeout/3.
	HalfOpenTimeout time.Duration
	// RecvDepth is the number of receive buffers shared by all clients.
	RecvDepth int
	// MaxHalfOpen bounds the connections accepted whose client has not
	// sent a message yet; more connection requests are rejected as busy
	// and the clients back off (admit.go). Zero means DefaultMaxHalfOpen.
	MaxHalfOpen int
	// MaxPendingWrites bounds the table WRITEs waiting to be executed:
	// past it, registrations are answered busy (ErrBusy) and the agents
	// back off. Zero means DefaultMaxPendingWrites.
	MaxPendingWrites int
	// NoDC creates no DCT (a device without the DC transport, such as an
	// RNIC other than mlx5): the bootstrap then carries DCT number 0, and
	// clients READ the table only over their RC connection.
	NoDC bool
	// Clock drives leases, sweeps and idle reclaim; nil is the system
	// clock.
	Clock clock.Clock
	// Auth: node keys and per-source registration limits (auth.go).
	Auth AuthConfig
}

func (c *ServerConfig) fill() error {
	if c.Service == 0 {
		c.Service = DefaultService
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.Neighborhood == 0 {
		c.Neighborhood = DefaultNeighborhood
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.MinLease == 0 {
		c.MinLease = min(DefaultMinLease, c.Lease)
	}
	if c.MaxLease == 0 {
		c.MaxLease = max(DefaultMaxLease, c.Lease)
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = max(c.Lease/10, 10*time.Millisecond)
	}
	if c.FirstAssignedGID == 0 {
		c.FirstAssignedGID = DefaultFirstAssignedGID
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxConnsPerSource == 0 {
		c.MaxConnsPerSource = DefaultMaxConnsPerSource
	}
	if c.HalfOpenTimeout == 0 {
		c.HalfOpenTimeout = c.IdleTimeout / 2
	}
	if c.RecvDepth == 0 {
		c.RecvDepth = DefaultRecvDepth
	}
	if c.MaxHalfOpen == 0 {
		c.MaxHalfOpen = DefaultMaxHalfOpen
	}
	if c.MaxPendingWrites == 0 {
		c.MaxPendingWrites = DefaultMaxPendingWrites
	}
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	switch {
	case c.MinLease <= 0 || c.MinLease > c.Lease || c.Lease > c.MaxLease:
		return fmt.Errorf("meta: leases: want 0 < MinLease <= Lease <= MaxLease")
	case c.MaxLease > time.Duration(1<<31)*time.Millisecond:
		return fmt.Errorf("meta: MaxLease %v too long", c.MaxLease)
	case c.SweepInterval < 0 || c.IdleTimeout < 0 || c.MaxConns < 0 || c.MaxConnsPerSource < 0 || c.HalfOpenTimeout < 0 ||
		c.MaxHalfOpen < 0 || c.MaxPendingWrites < 0:
		return fmt.Errorf("meta: negative interval or limit")
	case c.RecvDepth < 1 || c.RecvDepth > 1<<16:
		return fmt.Errorf("meta: RecvDepth %d: want 1..65536", c.RecvDepth)
	}
	if err := c.Auth.check(); err != nil {
		return err
	}
	_, err := newGeom(c.Slots, c.Neighborhood)
	return err
}

// ServerStats are a meta server's counters.
type ServerStats struct {
	Nodes, Conns   int    // live registrations and client connections now
	Registered     uint64 // successful registrations (new or refreshed)
	Renewed        uint64 // successful heartbeats
	Deregistered   uint64
	Expired        uint64 // leases that ran out
	Refused        uint64 // requests refused with ErrGIDInUse
	Full           uint64 // registrations refused with ErrTableFull
	Lookups        uint64 // RPC lookups answered
	Malformed      uint64 // messages that did not parse
	TableWrites    uint64 // RDMA WRITEs posted to the table
	Moves          uint64 // hopscotch displacements
	DroppedReplies uint64 // replies not sent (send queue full, connection gone)
	LoopRepairs    uint64 // times the loopback QP pair failed and was re-created
	Accepted       uint64 // connections accepted
	Rejected       uint64 // connection requests refused
	Reaped         uint64 // connections reclaimed (idle, in error, or bye)
	// Busy counts load shed: connection requests rejected and
	// registrations answered busy (admit.go).
	Busy uint64
	// HalfOpen and PendingWrites are the admission bounds' gauges now
	// (connections not heard from yet; table WRITEs waiting or in
	// flight), PeakHalfOpen and PeakPendingWrites their highest values.
	HalfOpen, PendingWrites         int
	PeakHalfOpen, PeakPendingWrites uint64
}

// Server is a meta server on a verbs device. See the package doc.
type Server struct {
	dev   verbs.Device
	cfg   ServerConfig
	clock clock.Clock
	geom  tableGeom
	boot  Bootstrap
	bootP []byte // boot.marshal(), the CM reply

	// Verbs resources, created by NewServer and destroyed by Close.
	pd       verbs.PD
	cq       verbs.CQ // every completion: messages, table writes, reply errors
	srq      verbs.SRQ
	table    []byte   // the table memory; written only by the NIC after setup
	tableRO  verbs.MR // remote-read view, the rkey clients get
	tableRW  verbs.MR // remote-write view, for the loopback QP only
	recvMem  []byte
	recvMR   verbs.MR
	loopReq  verbs.QP // posts the table WRITEs ...
	loopResp verbs.QP // ... which this QP, on the same device, executes
	// retired holds the QPNs of loopback QPs destroyed by a repair, whose
	// late completions are ignored. Owned by the loop.
	retired map[uint32]bool
	dct     verbs.QP
	dctSRQ  verbs.SRQ

	// connMu guards conns and closed. accept takes it on the device's
	// receive path; the loop takes it to find and reap connections.
	connMu sync.Mutex
	conns  map[uint32]*srvConn // by local QPN
	perSrc map[netip.Addr]int  // connections per source IP
	// halfOpen counts the conns not heard from yet (admit.go).
	halfOpen int
	closed   bool

	// regMu guards reg. The loop holds it while it handles a batch of
	// completions; Nodes takes it to list.
	regMu sync.Mutex
	reg   *registry

	// Loop state, owned by the loop goroutine.
	backlog  []writeBatch
	inflight map[uint64]writeBatch // posted groups, by the signaled WR's ID
	queued   int                   // the WRITEs of backlog and inflight
	// loopBroken is set when the loopback QP pair failed; repairLoopLocked
	// re-creates it before the next flush.
	loopBroken bool
	nextWR     uint64
	reposts    []verbs.RecvWR
	replies    []outReply
	arena      []byte
	// liveMap is the membership bitmap as the posted write groups leave
	// it, and mapGen the generation they leave (even). Owned by the loop.
	liveMap []uint64
	mapGen  uint64

	// guard binds entries to node keys and limits registrations per
	// source (auth.go, limits.go). Owned by the loop.
	guard guard

	sweeper *clock.Ticker
	// turns counts the loop's wake-ups: a test that drives a manual clock
	// waits for it to stand still before moving time on.
	turns atomic.Uint64
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once

	st struct {
		registered, renewed, deregistered, expired atomic.Uint64
		refused, full, lookups, malformed          atomic.Uint64
		tableWrites, droppedReplies, loopRepairs   atomic.Uint64
		accepted, rejected, reaped                 atomic.Uint64
		busy, peakPending, peakHalfOpen            atomic.Uint64
		pending                                    atomic.Int64
	}
}

// srvConn is one client's RC connection. qp and remote are immutable;
// lastRx is owned by the loop (set by accept before the loop can see it).
type srvConn struct {
	qp     verbs.QP
	remote netip.AddrPort
	lastRx time.Time
	heard  bool     // a message arrived; owned by the loop
	auth   connAuth // the node key the connection proved (auth.go); owned by the loop
}

// outReply is a reply waiting to be sent on the connection of QPN qpn.
type outReply struct {
	qpn uint32
	m   message
}

// NewServer starts a meta server on dev: it registers the table, sets up
// the loopback QP that writes it, a DCT for DCI readers, and listens for
// clients on cfg.Service. The device stays the caller's: Close releases
// what the server created but leaves the device open. The device must be
// bound to a specific address (not a wildcard), since the server
// connects a QP to its own address.
func NewServer(dev verbs.Device, cfg ServerConfig) (*Server, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	g, _ := newGeom(cfg.Slots, cfg.Neighborhood)
	s := &Server{
		dev:      dev,
		cfg:      cfg,
		clock:    cfg.Clock,
		geom:     g,
		conns:    make(map[uint32]*srvConn),
		inflight: make(map[uint64]writeBatch),
		retired:  make(map[uint32]bool),
		done:     make(chan struct{}),
	}
	if err := s.setup(); err != nil {
		s.release()
		return nil, err
	}
	s.sweeper = clock.NewTicker(s.clock, s.cfg.SweepInterval)
	s.wg.Add(1)
	go s.loop()
	return s, nil
}

// Serve runs a meta server on dev until ctx ends, then closes it; it is
// the standalone mode's main loop (`krfs meta`). The caller opens the
// device (softnic.OpenUDP) and closes it after Serve returns.
func Serve(ctx context.Context, dev verbs.Device, cfg ServerConfig) error {
	s, err := NewServer(dev, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return s.Close()
}

func (s *Server) setup() error {
	var err error
	now := time.Unix(0, s.clock.Now().UnixNano()) // as the header stores it
	inc := rand.Uint64() | 1
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return err
	}
	if s.cq, err = s.dev.CreateCQ(s.cfg.RecvDepth + 2*loopDepth + 4096); err != nil {
		return err
	}
	// The table: header now, slots all free (zero). Written before the
	// MR is registered; from then on only the NIC touches it.
	// Page-aligned: clients READ the table at offsets, so its MRs must be
	// zero-based (verbs.MR.IOVA 0), which a NIC allows only for memory
	// that starts on a page boundary.
	s.table = verbs.PageAligned(s.geom.bytes() + s.geom.mapBytes()) // then the membership map
	s.liveMap = make([]uint64, s.geom.mapWords())
	putHeader(s.table, tableHeader{geom: s.geom, epoch: now, serverInc: inc})
	if s.tableRO, err = s.pd.RegMR(s.table, verbs.AccessRemoteRead); err != nil {
		return err
	}
	if s.tableRW, err = s.pd.RegMR(s.table, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return err
	}
	s.reg = newRegistry(s.geom, now, &s.cfg, inc)
	// Receive buffers, shared by every client through one SRQ.
	s.recvMem = make([]byte, s.cfg.RecvDepth*MaxMessage)
	if s.recvMR, err = s.pd.RegMR(s.recvMem, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if s.srq, err = s.pd.CreateSRQ(s.cfg.RecvDepth); err != nil {
		return err
	}
	wrs := make([]verbs.RecvWR, s.cfg.RecvDepth)
	for i := range wrs {
		wrs[i] = s.recvWR(i)
	}
	if err = s.srq.PostRecv(wrs); err != nil {
		return err
	}
	if err = s.setupLoop(); err != nil {
		return fmt.Errorf("meta: loopback QP: %w", err)
	}
	// A DCT, so that nodes can READ the table through their DCIs too.
	var dctn uint32
	var dcKey uint64
	if !s.cfg.NoDC {
		if dctn, dcKey, err = s.setupDCT(); err != nil {
			return fmt.Errorf("meta: DCT (ServerConfig.NoDC runs without): %w", err)
		}
	}
	s.boot = Bootstrap{
		TableRKey:         s.tableRO.RKey(),
		TableLen:          uint32(s.geom.bytes()),
		Slots:             s.geom.slots,
		Neighborhood:      s.geom.nbhd,
		Epoch:             now,
		ServerIncarnation: inc,
		DCTN:              dctn,
		DCKey:             dcKey,
		IdleTimeout:       s.cfg.IdleTimeout,
		Lease:             s.cfg.Lease,
		MapOffset:         uint32(s.geom.mapOffset()),
		NodeKeys:          true,
	}
	s.bootP = s.boot.marshal()
	return s.dev.ListenRC(s.cfg.Service, s.accept)
}

// setupDCT creates the DCT that serves READs of the table to DCIs and
// returns its number and DC key.
func (s *Server) setupDCT() (uint32, uint64, error) {
	var err error
	if s.dctSRQ, err = s.pd.CreateSRQ(1); err != nil {
		return 0, 0, err
	}
	dcKey := rand.Uint64()
	if s.dct, err = s.pd.CreateQP(verbs.QPConfig{Type: verbs.DCT, RecvCQ: s.cq, SRQ: s.dctSRQ, DCKey: dcKey}); err != nil {
		return 0, 0, err
	}
	if err = s.dct.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead}); err != nil {
		return 0, 0, err
	}
	if err = s.dct.Modify(verbs.QPAttr{State: verbs.StateRTR}); err != nil {
		return 0, 0, err
	}
	return s.dct.QPN(), dcKey, nil
}

// recvWR is receive buffer i's WR. Its ID carries recvBit: an error
// completion has no opcode, so the ID is what tells a receive from a send.
func (s *Server) recvWR(i int) verbs.RecvWR {
	return verbs.RecvWR{ID: recvBit | uint64(i), Local: verbs.SGE{MR: s.recvMR, Offset: uint64(i * MaxMessage), Length: MaxMessage}}
}

// accept runs on the device's receive path for each connection request.
func (s *Server) accept(req verbs.ConnRequest) (verbs.QP, []byte, error) {
	if err := checkBootRequest(req.Private); err != nil {
		s.st.rejected.Add(1)
		return nil, nil, err
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.closed {
		s.st.rejected.Add(1)
		return nil, nil, ErrClosed
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.st.rejected.Add(1)
		return nil, nil, fmt.Errorf("meta: %d connections, the limit", len(s.conns))
	}
	if err := s.admitConnLocked(); err != nil {
		s.st.rejected.Add(1)
		return nil, nil, err
	}
	if s.perSrc[req.RemoteAddr.Addr()] >= s.cfg.MaxConnsPerSource {
		s.st.rejected.Add(1)
		return nil, nil, fmt.Errorf("meta: %d connections from %v, the limit per source", s.cfg.MaxConnsPerSource, req.RemoteAddr.Addr())
	}
	qp, err := s.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq, SRQ: s.srq,
		Caps: verbs.QPCaps{MaxSendWR: connSendDepth, MaxInline: MaxMessage}})
	if err != nil {
		s.st.rejected.Add(1)
		return nil, nil, err
	}
	// Clients may only READ (the table), whatever the connection manager
	// would grant by default; a dead client is given up on after a few
	// RNR retries instead of forever, and a slow one (a loaded machine
	// stalls a process for tens of milliseconds) only after about a
	// second without ACKs. QPs keep these across RESET.
	err = qp.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead, RNRRetry: 6,
		Timeout: connQPTimeout, RetryCnt: DefaultQPRetryCnt})
	if err == nil {
		err = qp.Modify(verbs.QPAttr{State: verbs.StateReset})
	}
	if err != nil {
		qp.Destroy()
		s.st.rejected.Add(1)
		return nil, nil, err
	}
	s.conns[qp.QPN()] = &srvConn{qp: qp, remote: req.RemoteAddr, lastRx: s.clock.Now()}
	if s.perSrc == nil {
		s.perSrc = make(map[netip.Addr]int)
	}
	s.perSrc[req.RemoteAddr.Addr()]++
	if s.halfOpen++; uint64(s.halfOpen) > s.st.peakHalfOpen.Load() {
		s.st.peakHalfOpen.Store(uint64(s.halfOpen))
	}
	s.st.accepted.Add(1)
	return qp, s.bootP, nil
}

// Bootstrap returns what clients learn when they connect.
func (s *Server) Bootstrap() Bootstrap { return s.boot }

// Addr is the address clients connect to: the device's.
func (s *Server) Addr() netip.AddrPort { return s.dev.Addr() }

// Nodes lists the live registrations, sorted by gid.
func (s *Server) Nodes() []NodeInfo {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	return s.reg.list()
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	s.regMu.Lock()
	nodes, moves := len(s.reg.nodes), s.reg.moves
	s.regMu.Unlock()
	s.connMu.Lock()
	conns, halfOpen := len(s.conns), s.halfOpen
	s.connMu.Unlock()
	return ServerStats{
		Nodes:             nodes,
		Conns:             conns,
		Registered:        s.st.registered.Load(),
		Renewed:           s.st.renewed.Load(),
		Deregistered:      s.st.deregistered.Load(),
		Expired:           s.st.expired.Load(),
		Refused:           s.st.refused.Load(),
		Full:              s.st.full.Load(),
		Lookups:           s.st.lookups.Load(),
		Malformed:         s.st.malformed.Load(),
		TableWrites:       s.st.tableWrites.Load(),
		Moves:             moves,
		DroppedReplies:    s.st.droppedReplies.Load(),
		LoopRepairs:       s.st.loopRepairs.Load(),
		Accepted:          s.st.accepted.Load(),
		Rejected:          s.st.rejected.Load(),
		Reaped:            s.st.reaped.Load(),
		Busy:              s.st.busy.Load(),
		HalfOpen:          halfOpen,
		PendingWrites:     int(s.st.pending.Load()),
		PeakHalfOpen:      s.st.peakHalfOpen.Load(),
		PeakPendingWrites: s.st.peakPending.Load(),
	}
}

// Close stops the server and releases its verbs resources. Clients'
// READs then fail and their nodes notice. Connection requests keep being
// refused: the verbs interface has no way to stop listening, so the
// device cannot host another meta server on the same service.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.connMu.Lock()
		s.closed = true
		s.connMu.Unlock()
		s.sweeper.Stop()
		close(s.done)
		s.wg.Wait()
		s.release()
	})
	return nil
}

// release destroys whatever setup created, in reverse order.
func (s *Server) release() {
	s.connMu.Lock()
	s.closed = true
	for n, c := range s.conns {
		c.qp.Destroy()
		delete(s.conns, n)
	}
	s.connMu.Unlock()
	for _, q := range []verbs.QP{s.dct, s.loopReq, s.loopResp} {
		if q != nil {
			q.Destroy()
		}
	}
	for _, q := range []verbs.SRQ{s.dctSRQ, s.srq} {
		if q != nil {
			q.Destroy()
		}
	}
	for _, m := range []verbs.MR{s.recvMR, s.tableRW, s.tableRO} {
		if m != nil {
			m.Dereg()
		}
	}
	if s.cq != nil {
		s.cq.Destroy()
	}
}
