package meta

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
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
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	switch {
	case c.MinLease <= 0 || c.MinLease > c.Lease || c.Lease > c.MaxLease:
		return fmt.Errorf("meta: leases: want 0 < MinLease <= Lease <= MaxLease")
	case c.MaxLease > time.Duration(1<<31)*time.Millisecond:
		return fmt.Errorf("meta: MaxLease %v too long", c.MaxLease)
	case c.SweepInterval < 0 || c.IdleTimeout < 0 || c.MaxConns < 0 || c.MaxConnsPerSource < 0 || c.HalfOpenTimeout < 0:
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
	closed bool

	// regMu guards reg. The loop holds it while it handles a batch of
	// completions; Nodes takes it to list.
	regMu sync.Mutex
	reg   *registry

	// Loop state, owned by the loop goroutine.
	backlog  []writeBatch
	inflight map[uint64]writeBatch // posted groups, by the signaled WR's ID
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
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	st struct {
		registered, renewed, deregistered, expired atomic.Uint64
		refused, full, lookups, malformed          atomic.Uint64
		tableWrites, droppedReplies, loopRepairs   atomic.Uint64
		accepted, rejected, reaped                 atomic.Uint64
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

// writeBatch is table WRITEs to post together, the slots they write (in
// order, for a repair) and the replies that may leave once they are done.
type writeBatch struct {
	wrs     []verbs.SendWR
	slots   []int
	replies []outReply
	// mapOpen: the batch wrote an odd membership generation before a
	// slot whose occupancy changes; closeMap then writes mapDirty, the
	// bitmap words changed, and the next even generation.
	mapOpen  bool
	mapDirty map[int]bool
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

// setupLoop connects two RC QPs of the server's own device to each other:
// loopReq posts WRITEs that loopResp executes into the table.
func (s *Server) setupLoop() error {
	var err error
	s.loopReq, err = s.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Caps: verbs.QPCaps{MaxSendWR: loopDepth, MaxRecvWR: 1, MaxInline: EntrySize}})
	if err != nil {
		return err
	}
	s.loopResp, err = s.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Caps: verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		return err
	}
	self := s.dev.Addr()
	for _, p := range [][2]verbs.QP{{s.loopReq, s.loopResp}, {s.loopResp, s.loopReq}} {
		q, peer := p[0], p[1]
		// The ACK timeout of a client connection, not the NIC's default
		// (8 ms): on a host starved of CPU the WRITEs' ACKs wait in the
		// server's own socket, and every retransmission go-back-N of the
		// whole group went into that same socket, ahead of the clients'
		// requests (a meta service given 1% of a CPU read 7,114 loopback
		// WRITEs of 8,880 datagrams; TestStarvedServerLoopbackRetransmits).
		if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteWrite,
			Timeout: connQPTimeout, RetryCnt: DefaultQPRetryCnt}); err != nil {
			return err
		}
		if err := q.Modify(verbs.QPAttr{State: verbs.StateRTR, RemoteAddr: self, RemoteQPN: peer.QPN()}); err != nil {
			return err
		}
		if err := q.Modify(verbs.QPAttr{State: verbs.StateRTS}); err != nil {
			return err
		}
	}
	return nil
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
	conns := len(s.conns)
	s.connMu.Unlock()
	return ServerStats{
		Nodes:          nodes,
		Conns:          conns,
		Registered:     s.st.registered.Load(),
		Renewed:        s.st.renewed.Load(),
		Deregistered:   s.st.deregistered.Load(),
		Expired:        s.st.expired.Load(),
		Refused:        s.st.refused.Load(),
		Full:           s.st.full.Load(),
		Lookups:        s.st.lookups.Load(),
		Malformed:      s.st.malformed.Load(),
		TableWrites:    s.st.tableWrites.Load(),
		Moves:          moves,
		DroppedReplies: s.st.droppedReplies.Load(),
		LoopRepairs:    s.st.loopRepairs.Load(),
		Accepted:       s.st.accepted.Load(),
		Rejected:       s.st.rejected.Load(),
		Reaped:         s.st.reaped.Load(),
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

// loop is the server's only goroutine: it handles messages, posts table
// writes, sends replies and sweeps leases.
func (s *Server) loop() {
	defer s.wg.Done()
	wcs := make([]verbs.WC, 128)
	for {
		for {
			n := s.cq.Poll(wcs)
			if n == 0 {
				break
			}
			s.handleWCs(wcs[:n])
		}
		select {
		case <-s.cq.Notify():
		case <-s.sweeper.C:
			s.sweep()
		case <-s.done:
			return
		}
	}
}

// handleWCs handles one batch of completions and sends what it produced.
func (s *Server) handleWCs(wcs []verbs.WC) {
	now := s.clock.Now()
	s.regMu.Lock()
	var wb writeBatch
	for i := range wcs {
		wc := &wcs[i]
		switch {
		case wc.ID&recvBit != 0:
			s.onMessage(wc, now, &wb)
		case s.isLoop(wc.QPN):
			s.onTableWritten(wc)
		case s.retired[wc.QPN]:
			// A late completion of a loopback QP a repair replaced.
		case wc.Status != verbs.StatusSuccess:
			// A reply failed: the client is gone.
			s.reap(wc.QPN)
		}
	}
	s.queueWrites(&wb)
	s.repairLoopLocked()
	s.regMu.Unlock()
	s.flush()
}

// onMessage handles one received message. Replies that must wait until
// the table shows the change are attached to wb.
func (s *Server) onMessage(wc *verbs.WC, now time.Time, wb *writeBatch) {
	buf := int(wc.ID &^ recvBit)
	s.reposts = append(s.reposts, s.recvWR(buf))
	if wc.Status != verbs.StatusSuccess {
		if wc.Status != verbs.StatusWRFlushErr {
			s.st.malformed.Add(1) // longer than MaxMessage
		}
		return
	}
	s.connMu.Lock()
	c := s.conns[wc.QPN]
	s.connMu.Unlock()
	if c == nil {
		return
	}
	c.lastRx = now
	c.heard = true
	b := s.recvMem[buf*MaxMessage : buf*MaxMessage+int(min(wc.ByteLen, MaxMessage))]
	m, err := parseMessage(b)
	if err == nil && m.kind&replyBit != 0 {
		err = fmt.Errorf("%w: a reply sent to the server", ErrMalformed)
	}
	if err != nil {
		s.st.malformed.Add(1)
		if kind, id, v, ok := parseMsgHeader(b); ok && kind&replyBit == 0 && kind != kindBye && bodyLen(kind|replyBit, stMalformed, v) == 0 {
			s.replies = append(s.replies, outReply{wc.QPN, message{kind: kind | replyBit, status: stMalformed, reqID: id, version: v}})
		}
		return
	}
	if rep, handled := s.admit(c, &m, now); handled {
		// hello, auth, or a request the node's key or its source's
		// limits refuse (auth.go).
		s.replies = append(s.replies, outReply{wc.QPN, rep})
		return
	}
	var rep message
	var ws []slotWrite
	switch m.kind {
	case kindRegister:
		rep, ws = s.reg.register(&m, now)
		switch rep.status {
		case stOK:
			s.bind(c, &rep, now)
			s.st.registered.Add(1)
		case stInUse:
			s.st.refused.Add(1)
		case stFull:
			s.st.full.Add(1)
		}
	case kindHeartbeat:
		rep, ws = s.reg.heartbeat(&m, now)
		switch rep.status {
		case stOK:
			s.st.renewed.Add(1)
		case stInUse:
			s.st.refused.Add(1)
		case stNotRegistered:
			if len(ws) > 0 {
				s.st.expired.Add(1)
			}
		}
		if rep.status == stOK {
			// The new expiry word is advisory: reply at once.
			rep.version = m.version
			s.replies = append(s.replies, outReply{wc.QPN, rep})
			s.addWrites(wb, ws, nil)
			return
		}
	case kindDeregister:
		rep, ws = s.reg.deregister(&m)
		if rep.status == stOK {
			s.st.deregistered.Add(1)
		}
	case kindLookup:
		rep = s.reg.lookup(&m, now)
		s.st.lookups.Add(1)
	case kindPing:
		rep = message{kind: kindPing | replyBit, reqID: m.reqID}
	case kindBye:
		s.reap(wc.QPN)
		return
	}
	rep.version = m.version // answer in the version asked in
	if len(ws) == 0 {
		s.replies = append(s.replies, outReply{wc.QPN, rep})
		return
	}
	s.addWrites(wb, ws, &outReply{wc.QPN, rep})
}

// addWrites turns slot writes into WRITE WRs on wb; rep, if any, leaves
// once they are done.
//
// A whole-slot write from version v to v+2 is four WRITEs, executed in
// order by the RC responder: the head version becomes v+1 (odd: a write
// is in progress), the tail v+2, then the body, then the head v+2. A
// reader READs a slot in address order and accepts it only if head and
// tail are equal and even; see the package doc for why that never
// accepts a mix of two versions. An expiry-only write is one 4-byte
// WRITE of the expiry word, in place.
func (s *Server) addWrites(wb *writeBatch, ws []slotWrite, rep *outReply) {
	for _, w := range ws {
		base := slotOffset(w.slot)
		wb.slots = append(wb.slots, w.slot)
		if w.expiryOnly {
			p := s.inline(4)
			binary.LittleEndian.PutUint32(p, w.e.expiry)
			wb.wrs = append(wb.wrs, s.writeWR(base+offExpiry, p))
			continue
		}
		word, bit := w.slot/64, uint64(1)<<(w.slot%64)
		if was := s.liveMap[word]&bit != 0; was != w.e.live {
			s.openMap(wb)
			s.liveMap[word] ^= bit
			wb.mapDirty[word] = true
		}
		old, next := s.reg.idx.bump(w.slot)
		p := s.inline(EntrySize + 8)
		binary.LittleEndian.PutUint32(p[0:], old+1)
		binary.LittleEndian.PutUint32(p[4:], next)
		body := p[8:]
		putEntryBody(body, &w.e)
		wb.wrs = append(wb.wrs,
			s.writeWR(base+offHead, p[0:4]),
			s.writeWR(base+offTail, p[4:8]),
			s.writeWR(base+offGID, body[offGID:offTail]),
			s.writeWR(base+offHead, p[4:8]))
	}
	if rep != nil {
		wb.replies = append(wb.replies, *rep)
	}
	if len(wb.wrs) >= writeGroup {
		s.queueWrites(wb)
	}
}

// openMap starts a change of occupancy in wb: the membership generation
// becomes odd before any of the slots that follow is written.
func (s *Server) openMap(wb *writeBatch) {
	if wb.mapOpen {
		return
	}
	wb.mapOpen = true
	if wb.mapDirty == nil {
		wb.mapDirty = make(map[int]bool)
	}
	s.mapGen++
	p := s.inline(8)
	binary.LittleEndian.PutUint64(p, s.mapGen)
	wb.wrs = append(wb.wrs, s.writeWR(uint64(s.geom.mapOffset()), p))
}

// closeMap ends wb's change of occupancy: the changed bitmap words, in
// runs of at most EntrySize bytes (the loopback QP's inline limit), then
// the next even generation.
func (s *Server) closeMap(wb *writeBatch) {
	if !wb.mapOpen {
		return
	}
	words := make([]int, 0, len(wb.mapDirty))
	for w := range wb.mapDirty {
		words = append(words, w)
	}
	slices.Sort(words)
	const perWrite = EntrySize / 8
	for i := 0; i < len(words); {
		j := i + 1
		for j < len(words) && words[j] == words[j-1]+1 && j-i < perWrite {
			j++
		}
		p := s.inline(8 * (j - i))
		for k := i; k < j; k++ {
			binary.LittleEndian.PutUint64(p[8*(k-i):], s.liveMap[words[k]])
		}
		wb.wrs = append(wb.wrs, s.writeWR(uint64(s.geom.mapOffset()+8+8*words[i]), p))
		i = j
	}
	s.mapGen++
	p := s.inline(8)
	binary.LittleEndian.PutUint64(p, s.mapGen)
	wb.wrs = append(wb.wrs, s.writeWR(uint64(s.geom.mapOffset()), p))
	wb.mapOpen, wb.mapDirty = false, nil
}

// rewriteMap makes wb write the whole membership map again (a repair: the
// writes of a failed group may not have reached it).
func (s *Server) rewriteMap(wb *writeBatch) {
	s.openMap(wb)
	for w := range s.liveMap {
		wb.mapDirty[w] = true
	}
}

// inline hands out n bytes of the arena that holds inline WRITE and SEND
// payloads until they are posted (PostSend copies inline data).
func (s *Server) inline(n int) []byte {
	if cap(s.arena)-len(s.arena) < n {
		s.arena = make([]byte, 0, max(64<<10, n))
	}
	s.arena = s.arena[:len(s.arena)+n]
	return s.arena[len(s.arena)-n:]
}

func (s *Server) writeWR(off uint64, p []byte) verbs.SendWR {
	return verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline, InlineData: p, RemoteAddr: off, RKey: s.tableRW.RKey()}
}

// queueWrites moves wb to the backlog of write groups.
func (s *Server) queueWrites(wb *writeBatch) {
	s.closeMap(wb)
	if len(wb.wrs) == 0 {
		s.replies = append(s.replies, wb.replies...)
	} else {
		s.backlog = append(s.backlog, *wb)
	}
	*wb = writeBatch{}
}

// flush posts the write groups the loopback send queue has room for, one
// doorbell each with its last WRITE signaled, then sends the replies that
// may leave, and reposts receive buffers.
func (s *Server) flush() {
	for len(s.backlog) > 0 && !s.loopBroken && s.loopReq != nil {
		g := &s.backlog[0]
		if s.loopReq.SendQueueFree() < len(g.wrs) {
			break // the completions of earlier groups make room
		}
		s.nextWR++
		last := &g.wrs[len(g.wrs)-1]
		last.ID, last.Flags = s.nextWR, last.Flags|verbs.Signaled
		if err := s.loopReq.PostSend(g.wrs); err != nil {
			// The loopback QP failed. The group stays in the backlog
			// (if a prefix of it was posted, the repair rewrites its
			// slots anyway) and the pair is re-created at the next
			// batch or sweep.
			s.loopBroken = true
			break
		}
		s.st.tableWrites.Add(uint64(len(g.wrs)))
		s.inflight[s.nextWR] = *g
		s.backlog[0] = writeBatch{}
		s.backlog = s.backlog[1:]
	}
	if len(s.backlog) == 0 {
		s.backlog = nil
	}
	s.sendReplies()
	if len(s.reposts) > 0 {
		_ = s.srq.PostRecv(s.reposts) // fails only once the SRQ is destroyed
		s.reposts = s.reposts[:0]
	}
	if len(s.backlog) == 0 {
		// Everything handed out was posted, and PostSend copied it.
		s.arena = s.arena[:0]
	}
}

// onTableWritten releases the replies of a completed write group. A
// failed completion of either loopback QP means the pair is in error: the
// group stays in flight until repairLoopLocked rewrites its slots.
func (s *Server) onTableWritten(wc *verbs.WC) {
	if wc.Status != verbs.StatusSuccess {
		s.loopBroken = true
		return
	}
	g, ok := s.inflight[wc.ID]
	if !ok {
		return
	}
	delete(s.inflight, wc.ID)
	s.replies = append(s.replies, g.replies...)
}

// repairLoopLocked heals the table writer after its loopback QP pair
// failed (a burst of loss on the host's own address exhausts the RC
// retries as on any path): it destroys the pair, creates and connects a
// new one, and replaces every write group in flight or in the backlog by
// a whole-slot rewrite, from the registry, of each slot they write. A
// group in flight may have executed any prefix of its WRITEs, so its
// slots may hold a write in progress (odd head) that readers refuse; the
// rewrite gives each slot its current entry under a newer version, in the
// order the groups wrote them. The groups' replies leave once the rewrite
// is done, so no request is lost. If the pair cannot be created now, the
// next batch or sweep tries again.
//
// It runs on the loop with regMu held.
func (s *Server) repairLoopLocked() {
	if !s.loopBroken && s.loopReq != nil && s.loopReq.State() != verbs.StateErr {
		return
	}
	s.destroyLoop()
	if err := s.setupLoop(); err != nil {
		s.destroyLoop()
		s.loopBroken = true
		return
	}
	s.loopBroken = false
	s.st.loopRepairs.Add(1)
	// The groups in flight in the order they were posted (IDs grow),
	// then the backlog.
	ids := make([]uint64, 0, len(s.inflight))
	for id := range s.inflight {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	groups := make([]writeBatch, 0, len(ids)+len(s.backlog))
	for _, id := range ids {
		groups = append(groups, s.inflight[id])
		delete(s.inflight, id)
	}
	groups = append(groups, s.backlog...)
	s.backlog = nil
	var replies []outReply
	seen := make(map[int]bool)
	var wb writeBatch
	if len(groups) > 0 {
		s.rewriteMap(&wb)
		s.queueWrites(&wb)
	}
	for _, g := range groups {
		replies = append(replies, g.replies...)
		for _, i := range g.slots {
			if seen[i] {
				continue // each slot once, where it was first written
			}
			seen[i] = true
			w := slotWrite{slot: i} // free unless a gid lives there
			if gid := s.reg.idx.gids[i]; gid != 0 {
				if l := s.reg.nodes[gid]; l != nil {
					w.e = s.reg.entryOf(l)
				}
			}
			s.addWrites(&wb, []slotWrite{w}, nil) // queues full groups
		}
	}
	wb.replies = replies
	s.queueWrites(&wb)
}

// isLoop reports whether qpn is one of the current loopback QPs.
func (s *Server) isLoop(qpn uint32) bool {
	return s.loopReq != nil && (qpn == s.loopReq.QPN() || qpn == s.loopResp.QPN())
}

// destroyLoop destroys the loopback QP pair; its late completions are
// ignored.
func (s *Server) destroyLoop() {
	for _, q := range []verbs.QP{s.loopReq, s.loopResp} {
		if q != nil {
			s.retired[q.QPN()] = true
			q.Destroy()
		}
	}
	s.loopReq, s.loopResp = nil, nil
}

// sendReplies posts the queued replies, one doorbell per connection run.
func (s *Server) sendReplies() {
	var wrs []verbs.SendWR
	for i := 0; i < len(s.replies); {
		qpn := s.replies[i].qpn
		s.connMu.Lock()
		c := s.conns[qpn]
		s.connMu.Unlock()
		wrs = wrs[:0]
		j := i
		for ; j < len(s.replies) && s.replies[j].qpn == qpn; j++ {
			m := &s.replies[j].m
			p := s.inline(m.size())
			m.append(p[:0])
			wrs = append(wrs, verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, InlineData: p})
		}
		switch {
		case c == nil:
			s.st.droppedReplies.Add(uint64(j - i))
		case c.qp.SendQueueFree() < len(wrs):
			s.st.droppedReplies.Add(uint64(j - i))
		default:
			if err := c.qp.PostSend(wrs); err != nil {
				var pe *verbs.PostError
				n := len(wrs)
				if errors.As(err, &pe) {
					n -= pe.Index
				}
				s.st.droppedReplies.Add(uint64(n))
			}
		}
		i = j
	}
	clear(s.replies)
	s.replies = s.replies[:0]
}

// sweep removes expired leases and reclaims dead or idle connections.
func (s *Server) sweep() {
	now := s.clock.Now()
	s.regMu.Lock()
	ws, gone := s.reg.expire(now)
	var wb writeBatch
	s.addWrites(&wb, ws, nil)
	s.regMu.Unlock()
	s.st.expired.Add(uint64(len(gone)))
	s.queueWrites(&wb)
	s.regMu.Lock()
	s.repairLoopLocked() // if the pair is broken and an earlier try failed
	s.regMu.Unlock()
	var dead []uint32
	s.connMu.Lock()
	for n, c := range s.conns {
		if c.qp.State() == verbs.StateErr || now.Sub(c.lastRx) > s.cfg.IdleTimeout ||
			!c.heard && now.Sub(c.lastRx) > s.cfg.HalfOpenTimeout {
			dead = append(dead, n)
		}
	}
	s.connMu.Unlock()
	for _, n := range dead {
		s.reap(n)
	}
	s.flush()
}

// reap destroys the connection of QPN n.
func (s *Server) reap(n uint32) {
	s.connMu.Lock()
	c := s.conns[n]
	delete(s.conns, n)
	if c != nil {
		if s.perSrc[c.remote.Addr()]--; s.perSrc[c.remote.Addr()] <= 0 {
			delete(s.perSrc, c.remote.Addr())
		}
	}
	s.connMu.Unlock()
	if c != nil {
		c.qp.Destroy()
		s.st.reaped.Add(1)
	}
}
