package qpcore

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/dct"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/verbs"
)

// Node is one krfs node's view of the RDMA fabric: its DCI pool and DCT,
// its RC pool, the peers it talks to, its region directory and its message
// ports. Its methods may be called concurrently.
type Node struct {
	cfg         Config
	clock       clock.Clock  // cfg.Clock
	housekept   atomic.Int64 // clock time (Unix ns) of the dispatcher's last housekeeping or its start (tests wait for it)
	dev         verbs.Device
	res         Resolver
	pd          verbs.PD
	scq         verbs.CQ       // send completions of every DCI and RC QP
	dscq        verbs.DrivenCQ // scq, if synchronous callers can drive the device's receive (else nil)
	rcq         verbs.CQ       // receive completions (DCT/SRQ and passive RC QPs)
	target      *dct.Target
	pool        *dct.Pool
	dcis        []*dciSlot
	dir         *regionDir
	mem         *memCache
	sinks       sinkPool
	ops         opTable
	msg         msgState
	incarnation uint64
	gid         atomic.Uint32
	ackTimeout  time.Duration // of every DCI and RC QP: attempt/8
	attempt     time.Duration // how long one WR may wait for an answer (see liveness.go)

	spare   atomic.Pointer[effects] // one free effects kept for the next newEffects
	syncOps sync.Pool               // recycled synchronous ops (see syncOp)

	mu     sync.Mutex // guards peers, lru, closed
	peers  map[uint32]*peer
	lru    list.List // of *peer, front = most recently connected
	closed bool

	dcMu sync.Mutex // guards arb and every peer.grant
	arb  *dct.Arbiter[*peer]

	rcs rcPool // the RC QPs' slots (rcpool.go)

	// passiveMu guards passive. The device's receive goroutine takes it
	// (accept), so it is never held while calling a device function that
	// waits for the receive path (QP.Destroy, MR.Dereg).
	passiveMu sync.Mutex
	passive   map[verbs.QP]*passiveRC

	pollMu sync.Mutex // serializes send completion processing; guards wcs
	wcs    [64]verbs.WC
	rwcs   [64]verbs.WC // used by the dispatcher goroutine only

	stopEvents func() // unsubscribes onEvent

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	stop   chan struct{}
	wg     sync.WaitGroup
	stats  counters
}

// rcService is the connection-manager service qpcore's RC QPs connect to.
const rcService = 0x4b524301

func init() { verbs.RegisterServiceName(rcService, "qpcore's RC connection service") }

// NewNode builds a node on dev: a DCT with its SRQ, cfg.DCIs DCIs (with
// cfg.NoDC only the SRQ and no DCI), the region directory, posted receive
// buffers, and the connection-manager
// listener for RC QPs. res resolves peers. The caller keeps ownership of
// dev and closes it after Node.Close.
func NewNode(dev verbs.Device, res Resolver, cfg Config) (*Node, error) {
	if dev == nil || res == nil {
		return nil, fmt.Errorf("%w: NewNode needs a device and a resolver", verbs.ErrInvalidArg)
	}
	cfg.setDefaults()
	n := &Node{cfg: cfg, clock: cfg.Clock, dev: dev, res: res, peers: make(map[uint32]*peer),
		passive: make(map[verbs.QP]*passiveRC), stop: make(chan struct{})}
	n.incarnation = cfg.Incarnation
	for n.incarnation == 0 {
		n.incarnation = dct.NewKey()
	}
	n.gid.Store(cfg.GID)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.ackTimeout = dct.AckTimeout(cfg.PeerTimeout/attemptsPerTimeout, dct.DefaultRetryCnt)
	n.attempt = n.ackTimeout * (dct.DefaultRetryCnt + 1)
	ok := false
	defer func() {
		if !ok {
			n.teardown()
		}
	}()
	var err error
	if n.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	dcis := cfg.DCIs
	if cfg.NoDC {
		dcis = 0
	}
	sdepth := dcis*cfg.DCIDepth + cfg.RCCap*cfg.RCDepth + 64
	if n.scq, err = dev.CreateCQ(sdepth); err != nil {
		return nil, err
	}
	if d, ok := n.scq.(verbs.DrivenCQ); ok && !cfg.NoDrive {
		n.dscq = d
	}
	if n.rcq, err = dev.CreateCQ(cfg.RecvBuffers + 64); err != nil {
		return nil, err
	}
	if n.target, err = dct.NewTarget(n.pd, n.rcq, dct.TargetConfig{SRQDepth: cfg.RecvBuffers, NoDCT: cfg.NoDC}); err != nil {
		return nil, err
	}
	if cfg.NoDC {
		// No DCI: every peer is RC-only and never asks the arbiter, which
		// exists (with one slot no one takes) so that the code reading it
		// need not check.
		n.arb = dct.NewArbiter[*peer](1, cfg.DCIQuota)
	} else {
		if n.pool, err = dct.NewPool(n.pd, n.scq, dct.PoolConfig{DCIs: cfg.DCIs, Depth: cfg.DCIDepth, PeerTimeout: cfg.PeerTimeout / attemptsPerTimeout}); err != nil {
			return nil, err
		}
		for i := range n.pool.Len() {
			n.dcis = append(n.dcis, &dciSlot{idx: i, qp: n.pool.QP(i)})
		}
		n.arb = dct.NewArbiter[*peer](n.pool.Len(), cfg.DCIQuota)
	}
	var sync func()
	if s, ok := dev.(interface{ SyncMemory() }); ok {
		sync = s.SyncMemory
	}
	if n.dir, err = newRegionDir(n.pd, cfg.MaxRegions, n.incarnation, sync); err != nil {
		return nil, err
	}
	n.mem = newMemCache(n.pd, cfg.MemCacheMax, cfg.MemCacheSize)
	n.sinks.pd = n.pd
	if err = n.msg.init(n); err != nil {
		return nil, err
	}
	if err = dev.ListenRC(rcService, n.accept); err != nil {
		return nil, fmt.Errorf("qpcore: RC listener: %w", err)
	}
	n.stopEvents = dev.OnEvent(n.onEvent)
	ok = true
	n.wg.Add(1)
	go n.run()
	return n, nil
}

// Info is the metadata peers need to reach this node; register it with
// the meta service.
func (n *Node) Info() meta.NodeInfo {
	info := meta.NodeInfo{
		GID:         n.gid.Load(),
		Incarnation: n.incarnation,
		Addr:        n.dev.Addr(),
		DCTN:        n.target.DCTN(),
		DCKey:       n.target.Key(),
		DirRKey:     n.dir.rkey,
		DirLen:      uint32(len(n.dir.buf)),
		Transport:   n.cfg.Transport,
	}
	// The default region's key rides in the entry: a peer's first
	// operation on it needs no directory READ.
	if e, ok := n.dir.lookup(DefaultRegion); ok {
		info.MemRKey, info.MemLen, info.MemAccess = e.RKey, e.Len, e.Access
		// And its mode and owner, so that a peer can also stat it
		// (a file's LOOKUP) without a directory READ.
		info.MemOwnerKnown, info.MemMode, info.MemUID, info.MemGID = true, e.Mode, e.UID, e.GID
	}
	return info
}

// SetGID sets this node's gid (for example once the meta service assigned
// it).
func (n *Node) SetGID(gid uint32) { n.gid.Store(gid) }

// GID is this node's gid.
func (n *Node) GID() uint32 { return n.gid.Load() }

// Config is the node's configuration with defaults applied.
func (n *Node) Config() Config { return n.cfg }

// Export registers buf as a region peers can reach under name with the
// given remote access (verbs.AccessRemoteRead, ...Write, ...Atomic), and
// lists it in the region directory. buf must start on a page boundary
// (ErrUnaligned otherwise: verbs.PageAligned, mmap): peers address a
// region by offsets, which its MR allows only then. The caller keeps buf
// and must call SyncMemory-style barriers of its device as usual.
func (n *Node) Export(name string, buf []byte, access verbs.Access) (Region, error) {
	return n.dir.export(name, buf, access, 0o600, 0, 0)
}

// SetOwner changes the owner and permission bits listed for a region.
func (n *Node) SetOwner(name string, mode, uid, gid uint32) (Region, error) {
	return n.dir.setOwner(name, mode, uid, gid)
}

// Unexport removes a region from the directory and deregisters it: peers
// that still use its rkey get a remote access error.
func (n *Node) Unexport(name string) error { return n.dir.unexport(name) }

// Regions lists the regions this node exports.
func (n *Node) Regions() []Region { return n.dir.list() }

// Local returns the memory and the record of a region this node exports.
func (n *Node) Local(name string) ([]byte, Region, bool) {
	e, ok := n.dir.lookup(name)
	if !ok {
		return nil, Region{}, false
	}
	return e.mr.Buf(), e.Region, true
}

// Register registers buf for local use by operations, so that they do not
// register it on first use. Registered buffers must not overlap; a
// sub-slice of one may be passed to any operation.
func (n *Node) Register(buf []byte) error { return n.mem.register(buf) }

// Unregister removes a registration made by Register, once operations
// using it completed.
func (n *Node) Unregister(buf []byte) error { return n.mem.unregister(buf) }

// Close stops the node: every QP is destroyed, operations not completed
// fail with ErrClosed, regions are deregistered. The device stays open.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	n.closed = true
	_ = n.dev.StopListenRC(rcService)
	peers := make([]*peer, 0, len(n.peers))
	for _, p := range n.peers {
		peers = append(peers, p)
	}
	n.mu.Unlock()
	n.stopEvents()
	n.cancel()
	close(n.stop)
	for _, p := range peers {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
	}
	n.wg.Wait()
	err := n.teardown()
	e := n.newEffects()
	for _, o := range n.ops.all() {
		p := o.p
		p.mu.Lock()
		if o.state != opDone {
			n.finishLocked(p, o, ErrClosed, e)
		}
		p.mu.Unlock()
	}
	n.apply(e)
	n.msg.close()
	n.mem.close()
	n.sinks.close()
	return err
}

// teardown destroys the node's verbs objects.
func (n *Node) teardown() error {
	var errs []error
	keep := func(err error) {
		if err != nil && !errors.Is(err, verbs.ErrDestroyed) && !errors.Is(err, verbs.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if n.pool != nil {
		keep(n.pool.Close())
	}
	for _, c := range n.rcs.takeAll() {
		keep(c.qp.Destroy())
	}
	// verbs cannot unregister a CM listener: a nil map makes accept
	// refuse from now on.
	n.passiveMu.Lock()
	pas := n.passive
	n.passive = nil
	n.passiveMu.Unlock()
	for q := range pas {
		keep(q.Destroy())
	}
	if n.target != nil {
		keep(n.target.Close())
	}
	if n.dir != nil {
		keep(n.dir.close())
	}
	if n.scq != nil {
		keep(n.scq.Destroy())
	}
	if n.rcq != nil {
		keep(n.rcq.Destroy())
	}
	return errors.Join(errs...)
}

// goSafe runs f in a goroutine the node waits for on Close, unless the
// node is closed.
func (n *Node) goSafe(f func()) bool {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return false
	}
	n.wg.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.wg.Done()
		f()
	}()
	return true
}

// run is the dispatcher: it processes completions nobody else is waiting
// for and does the housekeeping.
func (n *Node) run() {
	defer n.wg.Done()
	tick := clock.NewTicker(n.clock, n.cfg.Tick)
	defer tick.Stop()
	n.housekept.Store(n.clock.Now().UnixNano())
	for {
		select {
		case <-n.stop:
			return
		case <-n.scq.Notify():
			n.pollSend(-1)
		case <-n.rcq.Notify():
			n.pollRecv()
		case <-tick.C:
			n.housekeep()
		}
	}
}

func (n *Node) housekeep() {
	now := n.clock.Now()
	for _, c := range n.rcs.idle(now, n.cfg.RCIdle) {
		if n.drainRC(c) {
			n.stats.rcIdle.Add(1)
		}
	}
	n.reclaimPassive(now)
	n.expireOps(now)
	n.housekept.Store(now.UnixNano())
}

// encodeRCPrivate is the private data of an RC connection request: the
// initiator's gid and the incarnation of the target it expects.
func encodeRCPrivate(gid uint32, targetInc uint64) []byte {
	b := make([]byte, 12)
	binary.LittleEndian.PutUint32(b, gid)
	binary.LittleEndian.PutUint64(b[4:], targetInc)
	return b
}
