package softnic

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/internal/eventq"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// Config configures a device.
type Config struct {
	// Link carries the device's packets; the device owns it from Open on
	// and closes it on Close.
	Link link.Link
	// Clock drives retransmission and RNR timers; nil means the system
	// clock.
	Clock link.Clock
	// MTU is the default path MTU (payload bytes per packet) of new QPs;
	// 0 means DefaultMTU. QPs may choose any MTU up to MaxMTU.
	MTU int
	// ClusterKey, if not empty, authenticates every packet: devices talk
	// in sessions set up by a handshake keyed by the cluster key, bound to
	// the peer's address, and every packet carries a session counter under
	// a MAC; packets without a valid MAC, from the wrong address, or
	// replayed are dropped and counted (DeviceStats.BadMAC, AuthStats), so
	// that a host outside the cluster that learns an rkey or a DC key, or
	// captures packets, still cannot read or write memory (see auth.go).
	// Payloads are then received into scratch and copied once verified
	// (no steering).
	ClusterKey []byte
	// Encrypt, with a ClusterKey, also encrypts every payload with
	// AES-256-GCM under the session keys (the tag replaces the MAC). All
	// devices of a cluster must agree: a device drops packets whose
	// encryption differs from its own setting.
	Encrypt bool
	// NoAtomics makes the device one without atomics (verbs.AtomicNone),
	// as upstream mlx5 is unless its firmware answers atomics in host
	// byte order: CMP_SWAP and FETCH_ADD are refused at post, and remote
	// atomic access at INIT (verbs.ErrNotSupported).
	NoAtomics bool
}

// DefaultMTU is the default path MTU: InfiniBand's largest. Bulk transfers
// still leave in 64 KiB system calls through GSO.
const DefaultMTU = 4096

// Device is a software RDMA NIC bound to one link endpoint.
type Device struct {
	link   link.Link
	clock  link.Clock
	mtu    int
	maxMTU int

	// rxMu is held by the link's receive goroutine from Steer to the end
	// of Deliver for one batch, and by anything that must not race with
	// payload being placed into memory: MR deregistration, QP destruction
	// and error flushes that complete READs. Lock order: rxMu, qp.mu,
	// (cq.mu | srq.mu | mu). The link may hold it while blocked receiving
	// into predicted memory (Predict): everything else takes it with
	// lockRx, which makes the link let go.
	rxMu       sync.Mutex
	rxWant     atomic.Int32                     // lockRx callers waiting for rxMu; Predict declines while > 0
	predictQP  atomic.Pointer[qp]               // the QP that last posted a READ: Predict looks there first
	sendQueued atomic.Int64                     // WRs in every QP's send queue (posted, not completed): Quiet
	rxIntr     atomic.Pointer[link.Interrupter] // the link's, from the first Predict; nil until then
	rxOut      outbox                           // responses built by the receive path; guarded by rxMu
	rxGen      uint64                           // rxOut generation, bumped at each flush; guarded by rxMu
	rxOutMem   bool                             // rxOut holds READ responses that reference MR memory; guarded by rxMu
	steerHdr   wire.Header                      // first header of the batch being steered; guarded by rxMu
	steerOK    bool
	steered    []steeredRange // memory handed out by Steer in this batch; guarded by rxMu
	delivered  int            // index of the packet being delivered; guarded by rxMu
	rxNow      time.Time      // the batch's clock reading (rxClock), valid if rxNowOK; guarded by rxMu
	rxNowOK    bool           // rxNow is this batch's; guarded by rxMu
	rxWCs      []pendingWC    // send completions held until rxOut is sent; guarded by rxMu
	rxQP       *qp            // the QP the receive path looked up last (nil: none); guarded by rxMu
	rxQPN      uint32         // rxQP's number; guarded by rxMu
	atomicMu   sync.Mutex     // serializes atomics on memory that is not 8-byte aligned
	cm         cmState
	events     eventq.Queue
	atomics    verbs.AtomicCap
	portDown   atomic.Bool // SetPortActive(false): nothing is sent or received
	sendMu     sync.Mutex  // guards sendOut
	sendOut    outbox
	closeOnce  sync.Once
	auth       *authState // packet authentication, nil without a cluster key

	// Receive-path probes (see requester.onTimer): datagrams the device
	// sends itself; one seen back proves that the receive path processed
	// everything that reached the link before it.
	probeAddr  netip.AddrPort // the device's own address (loopback if unspecified)
	probeNonce uint64         // tells our probes from anyone else's datagrams
	probesSent atomic.Uint64  // sequence number of the latest probe sent
	probesSeen atomic.Uint64  // highest probe sequence number received

	mu        sync.RWMutex // guards the fields below
	closed    bool
	qps       map[uint32]*qp
	nextQPN   uint32
	mrs       map[uint32]*mr
	mrBytes   uint64
	nextPD    uint32
	listeners map[uint32]verbs.AcceptFunc
	rng       *rand.Rand

	stats struct {
		txPackets, rxPackets atomic.Uint64
		txBytes, rxBytes     atomic.Uint64
		malformed, noQP      atomic.Uint64
		dcKeyRejects         atomic.Uint64
		retransmits          atomic.Uint64
		misplaced            atomic.Uint64
		writeCopied          atomic.Uint64
		badMAC               atomic.Uint64
		badVersion           atomic.Uint64 // also in malformed
	}
}

var _ verbs.Device = (*Device)(nil)

// Open starts a device on cfg.Link.
func Open(cfg Config) (*Device, error) {
	if cfg.Link == nil {
		return nil, fmt.Errorf("%w: softnic.Config needs a Link", verbs.ErrInvalidArg)
	}
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("softnic: seeding keys: %w", err)
	}
	d := &Device{
		link:      cfg.Link,
		clock:     cfg.Clock,
		mtu:       cfg.MTU,
		qps:       make(map[uint32]*qp),
		mrs:       make(map[uint32]*mr),
		listeners: make(map[uint32]verbs.AcceptFunc),
		rng:       rand.New(rand.NewChaCha8(seed)),
		atomics:   verbs.AtomicGlob,
	}
	if cfg.NoAtomics {
		d.atomics = verbs.AtomicNone
	}
	if d.clock == nil {
		d.clock = link.SystemClock{}
	}
	if len(cfg.ClusterKey) > 0 {
		d.auth = newAuth(d, append([]byte(nil), cfg.ClusterKey...), cfg.Encrypt)
		d.rxOut.auth = d.auth
		d.sendOut.auth = d.auth
	} else if cfg.Encrypt {
		return nil, fmt.Errorf("%w: Encrypt needs a ClusterKey", verbs.ErrInvalidArg)
	}
	d.maxMTU = cfg.Link.MaxDatagram() - wire.MaxHeaderLen - d.auth.overhead()
	if d.mtu == 0 {
		d.mtu = min(DefaultMTU, d.maxMTU)
	}
	if d.mtu < 256 || d.mtu > d.maxMTU {
		return nil, fmt.Errorf("%w: MTU %d outside [256, %d]", verbs.ErrInvalidArg, d.mtu, d.maxMTU)
	}
	d.nextQPN = 1 + d.rng.Uint32N(wire.PSNMask-1)
	d.probeNonce = d.rng.Uint64()
	d.probeAddr = link.SelfAddr(cfg.Link.LocalAddr())
	d.cm.init()
	cfg.Link.Start(d)
	return d, nil
}

func (d *Device) Addr() netip.AddrPort { return d.link.LocalAddr() }

// MaxMTU is the largest path MTU the link allows.
func (d *Device) MaxMTU() int { return d.maxMTU }

// Limits of a softnic device (verbs.DeviceAttr).
const (
	MaxCQE   = 1 << 20
	MaxSRQWR = 1 << 16
	MaxQPWR  = 1 << 16
)

// Attr implements verbs.Device. Atomics are executed with the CPU's
// atomic instructions (AtomicGlob) unless Config.NoAtomics.
func (d *Device) Attr() verbs.DeviceAttr {
	return verbs.DeviceAttr{Atomic: d.atomics, MaxSRQWR: MaxSRQWR, MaxCQE: MaxCQE, MaxQPWR: MaxQPWR}
}

// OnEvent implements verbs.Device.
func (d *Device) OnEvent(fn func(verbs.Event)) (cancel func()) { return d.events.Subscribe(fn) }

// raise reports an asynchronous event; it never blocks.
func (d *Device) raise(ev verbs.Event) { d.events.Raise(ev) }

// SetPortActive brings the device's port down (false) or up (true), as
// a cable pulled and plugged back: while it is down the device sends and
// receives nothing (its QPs' retries run out as they would), and each
// change raises EventPortErr or EventPortActive (port 1).
func (d *Device) SetPortActive(active bool) {
	if d.portDown.Swap(!active) == !active {
		return
	}
	ev := verbs.EventPortActive
	if !active {
		ev = verbs.EventPortErr
	}
	d.raise(verbs.Event{Type: ev, Port: 1})
}

// MTU is the device's default path MTU.
func (d *Device) MTU() int { return d.mtu }

// Clock is the device's time source.
func (d *Device) Clock() link.Clock { return d.clock }

// randUint32 draws from the device's key generator; d.mu must be held.
func (d *Device) randUint32() uint32 { return d.rng.Uint32() }

func (d *Device) AllocPD() (verbs.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	d.nextPD++
	return &pd{dev: d, id: d.nextPD}, nil
}

func (d *Device) CreateCQ(depth int) (verbs.CQ, error) {
	if depth <= 0 || depth > MaxCQE {
		return nil, fmt.Errorf("%w: CQ depth %d (1..%d)", verbs.ErrInvalidArg, depth, MaxCQE)
	}
	d.mu.RLock()
	closed := d.closed
	d.mu.RUnlock()
	if closed {
		return nil, verbs.ErrClosed
	}
	return newCQ(d, depth), nil
}

func (d *Device) addQP(q *qp) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return verbs.ErrClosed
	}
	for {
		n := d.nextQPN
		d.nextQPN++
		if d.nextQPN > wire.PSNMask {
			d.nextQPN = 1
		}
		if _, used := d.qps[n]; !used {
			q.qpn = n
			break
		}
	}
	d.qps[q.qpn] = q
	return nil
}

// rxLookupQP is lookupQP for the receive path (rxMu held): packets come
// in runs for one QP, so the last one found is tried first.
func (d *Device) rxLookupQP(n uint32) *qp {
	if d.rxQP != nil && d.rxQPN == n {
		return d.rxQP
	}
	q := d.lookupQP(n)
	if q != nil {
		d.rxQP, d.rxQPN = q, n
	}
	return q
}

// removeQP takes q out of the device; rxMu is held (see Destroy).
func (d *Device) removeQP(q *qp) {
	if d.rxQP == q {
		d.rxQP = nil
	}
	d.mu.Lock()
	delete(d.qps, q.qpn)
	d.mu.Unlock()
}

func (d *Device) lookupQP(n uint32) *qp {
	d.mu.RLock()
	q := d.qps[n]
	d.mu.RUnlock()
	return q
}

// SyncMemory is a memory barrier between the caller and the device's
// receive path, which reads and writes registered memory on behalf of
// remote peers. Call it after writing memory that peers will READ, and
// before reading memory that peers wrote when that fact was learnt through
// another channel (a completion on another device, a message). The Go
// memory model, and so the race detector, then orders the NIC's accesses
// and the caller's. It waits for the receive batch in progress.
func (d *Device) SyncMemory() {
	d.lockRx() // the receive batch in progress has ended
	d.rxMu.Unlock()
}

// stopLinger ends a lingering link's linger (link.Lingerer). Call it
// before waiting without driving for something the link receives: a
// completion, a CM reply, a session handshake. Otherwise that datagram
// waits in the socket until the linger lapses, which also counts as a
// linger miss and turns lingering off for a second, so that every
// synchronous operation meanwhile pays two epoll_ctl calls.
func (d *Device) stopLinger() {
	if lg, ok := d.link.(link.Lingerer); ok {
		lg.StopLinger()
	}
}

// Stats returns the device counters.
func (d *Device) Stats() verbs.DeviceStats {
	ls := d.link.Stats()
	d.mu.RLock()
	s := verbs.DeviceStats{QPs: len(d.qps), MRs: len(d.mrs), MRBytes: d.mrBytes}
	d.mu.RUnlock()
	s.TxPackets = d.stats.txPackets.Load()
	s.RxPackets = d.stats.rxPackets.Load()
	s.TxBytes = d.stats.txBytes.Load()
	s.RxBytes = d.stats.rxBytes.Load()
	s.TxSyscalls, s.RxSyscalls = ls.TxSyscalls, ls.RxSyscalls
	s.TxErrors, s.TxDropped, s.RxErrors = ls.TxErrors, ls.TxDrops, ls.RxErrors
	s.Malformed = d.stats.malformed.Load()
	s.BadVersion = d.stats.badVersion.Load()
	s.NoQP = d.stats.noQP.Load()
	s.DCKeyRejects = d.stats.dcKeyRejects.Load()
	s.Retransmits = d.stats.retransmits.Load()
	s.Misplaced = d.stats.misplaced.Load() + ls.RxCopies
	s.WriteCopied = d.stats.writeCopied.Load()
	s.BadMAC = d.stats.badMAC.Load()
	if a := d.AuthStats(); d.auth != nil {
		s.BadMAC += a.BadTag + a.NoSession + a.WrongSource + a.Replayed + a.StaleInit
	}
	return s
}

// AuthStats returns the counters of packet authentication (zero without a
// cluster key).
func (d *Device) AuthStats() AuthStats {
	if d.auth == nil {
		return AuthStats{}
	}
	return d.auth.Stats()
}

// QPs lists the device's QPs by QPN.
func (d *Device) QPs() []verbs.QPInfo {
	d.mu.RLock()
	qs := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		qs = append(qs, q)
	}
	d.mu.RUnlock()
	out := make([]verbs.QPInfo, len(qs))
	for i, q := range qs {
		out[i] = q.Info()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].QPN < out[j].QPN })
	return out
}

// Close stops the link, then every QP's timers. Outstanding WRs are
// dropped without completions.
func (d *Device) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		qs := make([]*qp, 0, len(d.qps))
		for _, q := range d.qps {
			qs = append(qs, q)
		}
		d.mu.Unlock()
		err = d.link.Close()
		for _, q := range qs {
			q.mu.Lock()
			q.dead = true
			q.req.reset()
			q.mu.Unlock()
		}
		d.events.Close()
	})
	return err
}

// lockRx takes rxMu from outside the receive path. A link blocked in a
// predicted receive holds rxMu until a datagram arrives, so the request
// is published first (Predict then declines) and the link is
// interrupted; see link.Predictor.
func (d *Device) lockRx() {
	if d.rxMu.TryLock() {
		return
	}
	d.rxWant.Add(1)
	if in := d.rxIntr.Load(); in != nil {
		(*in).InterruptRecv()
	}
	d.rxMu.Lock()
	d.rxWant.Add(-1)
}

// Predict implements link.Predictor: the next response packets of the
// oldest READ in progress on the QP that last posted a READ, if that
// READ's destination is private (see mr.private). Nothing else is
// predicted: a WRITE's payload lands in memory peers and local programs
// see, so it is received into the link's scratch and copied into place
// once its header was checked (DeviceStats.WriteCopied). Nothing is
// predicted with a cluster key (payloads are verified before they land)
// or while another goroutine waits for rxMu.
//
// A receive that will not block (queued: a datagram is waiting) never
// waits for a QP's lock here: a QP whose lock is held (a caller posting
// on it) gets no prediction this time. Waiting would put the receiver to
// sleep behind the poster while the datagram waits, typically the very
// request being posted (a node reading itself: a futex hand-off that cost
// about 20% of a loopback FUSE pread); a datagram received without a
// prediction is still delivered right, its payload copied and counted
// (Misplaced). A receive that would block anyway takes the lock, so that
// the response of a READ whose request is still being posted is
// predicted (large READs stay zero-copy).
func (d *Device) Predict(p []link.Prediction, in link.Interrupter, queued bool) int {
	if d.rxIntr.Load() == nil {
		d.keepInterrupter(in)
	}
	if d.auth != nil || d.rxWant.Load() > 0 {
		return 0
	}
	n := 0
	if q := d.predictQP.Load(); q != nil && lockToPredict(q, queued) {
		if !q.dead && q.state == verbs.StateRTS {
			n = q.req.predict(p)
		}
		q.mu.Unlock()
	}
	return n
}

// keepInterrupter records the link's Interrupter for lockRx. It is a
// function of its own so that only its argument escapes: storing the
// address of Predict's parameter made every Predict allocate.
func (d *Device) keepInterrupter(in link.Interrupter) { d.rxIntr.Store(&in) }

// lockToPredict takes q's lock for Predict: only if it is free when a
// datagram is queued (see Predict), else waiting for it.
func lockToPredict(q *qp, queued bool) bool {
	if queued {
		return q.mu.TryLock()
	}
	q.mu.Lock()
	return true
}

// RxLock implements link.Receiver.
func (d *Device) RxLock() {
	d.rxMu.Lock()
	d.rxNowOK = false
	d.steerOK = false
	d.steered = d.steered[:0]
	d.delivered = 0
}

// rxClock is the time for the packets of the batch being delivered: the
// clock is read once per batch (one receive call: up to 64 KiB of GRO
// segments), when a packet first needs it. rxMu is held, between RxLock
// and RxUnlock. Every READ response segment that acknowledges progress
// restarts the ACK timeout; reading the clock for each of the ~725
// segments of a 1 MiB READ cost about 5% of the requesting daemon's CPU
// (two vDSO calls each, slow under this VM's paravirtual clock), against
// 17 readings now. A reading is early by at most the batch's processing
// time, microseconds against an ACK timeout of milliseconds.
func (d *Device) rxClock() time.Time {
	if !d.rxNowOK {
		d.rxNow, d.rxNowOK = d.clock.Now(), true
	}
	return d.rxNow
}

// pendingWC is a completion the receive path holds back: its WR's memory
// may still be referenced by packets waiting in rxOut (a retransmission
// queued before the WR was acknowledged), and the application owns that
// memory again once it sees the completion.
type pendingWC struct {
	cq *cq
	wc verbs.WC
}

// pushWC delivers a send completion of q, after rxOut when q's handlers
// run on the receive path.
func (d *Device) pushWC(q *qp, c *cq, wc verbs.WC) {
	if q.onRx {
		d.rxWCs = append(d.rxWCs, pendingWC{c, wc})
		return
	}
	c.push(wc)
}

// steeredRange is memory Steer handed out for packet index of a batch.
type steeredRange struct {
	index int
	lo    uintptr
	n     int
}

// clobbersLater reports whether writing dst while delivering the current
// packet would overwrite the payload of a later packet of the same batch,
// which the link has already placed there on a wrong steering prediction.
// The current packet is then dropped (and retransmitted later) instead.
func (d *Device) clobbersLater(dst []byte) bool {
	if len(dst) == 0 || len(d.steered) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&dst[0]))
	hi := lo + uintptr(len(dst))
	for _, s := range d.steered {
		if s.index > d.delivered && s.lo < hi && lo < s.lo+uintptr(s.n) {
			d.stats.misplaced.Add(1)
			return true
		}
	}
	return false
}

// wakeDrivers makes a Drive caller blocked receiving look at its
// condition again.
func (d *Device) wakeDrivers() {
	if drv, ok := d.link.(link.Driver); ok {
		drv.Wake()
	}
}

// RxUnlock implements link.Receiver: it sends what the batch produced
// (responses, coalesced ACKs, newly allowed requests) in one link send.
func (d *Device) RxUnlock() {
	woke := d.flushRx()
	d.rxNowOK = false
	d.rxMu.Unlock()
	if woke {
		// Let a consumer just woken by a completion run on this thread now,
		// instead of waking it on the other vCPU (~14 us there).
		runtime.Gosched()
	}
}

// flushRx sends rxOut and delivers the completions held back; it reports
// whether one of them woke a sleeping consumer (a Drive caller polls
// instead).
func (d *Device) flushRx() bool {
	d.rxOut.flush(d)
	d.rxGen++
	d.rxOutMem = false
	notified := false
	for i, p := range d.rxWCs {
		if p.cq.push(p.wc) {
			notified = true
		}
		d.rxWCs[i] = pendingWC{}
	}
	d.rxWCs = d.rxWCs[:0]
	return notified
}

// flushOutbox sends what out holds now: the receive path's outbox with the
// completions it held back (flushRx), any other at once.
func (d *Device) flushOutbox(out *outbox) {
	if out == &d.rxOut {
		d.flushRx()
		return
	}
	out.flush(d)
}

// beforeMemWrite must be called before the receive path changes MR memory:
// READ responses waiting in rxOut send their payload straight from MR
// memory, so they leave first and carry the bytes as of their execution.
func (d *Device) beforeMemWrite(out *outbox) {
	if out == &d.rxOut && d.rxOutMem {
		d.flushRx()
	}
}

// Steer implements link.Receiver: a READ response lands in the READ's
// local buffer at its offset when that buffer is private. Nothing else is
// steered: a WRITE's payload is copied into its target after its header
// was checked (see Predict).
func (d *Device) Steer(from netip.AddrPort, hdr []byte, index int, plen int) []byte {
	if index == 0 {
		h, _, err := wire.Parse(hdr)
		d.steerHdr, d.steerOK = h, err == nil
	}
	if !d.steerOK || plen == 0 || d.auth != nil || d.portDown.Load() {
		// With a cluster key nothing lands in memory before its MAC is
		// checked: payloads go to scratch and are copied once verified.
		return nil
	}
	h := &d.steerHdr
	q := d.rxLookupQP(h.DestQP)
	if q == nil {
		return nil
	}
	var dst []byte
	if h.Op == wire.OpReadResp {
		q.mu.Lock()
		dst = q.req.steer(from, h, index, plen)
		q.mu.Unlock()
	}
	if len(dst) > 0 {
		d.steered = append(d.steered, steeredRange{index, uintptr(unsafe.Pointer(&dst[0])), len(dst)})
	}
	return dst
}

// Deliver implements link.Receiver.
func (d *Device) Deliver(from netip.AddrPort, hdr []byte, payload []byte) {
	defer func() { d.delivered++ }()
	if d.isProbe(hdr, payload) || d.portDown.Load() {
		return
	}
	d.stats.rxPackets.Add(1)
	d.stats.rxBytes.Add(uint64(len(hdr) + len(payload)))
	h, n, err := wire.Parse(hdr)
	if err != nil || n != len(hdr) {
		d.stats.malformed.Add(1)
		if errors.Is(err, wire.ErrVersion) {
			d.refuseVersion(from, hdr, payload)
		}
		return
	}
	if d.auth != nil {
		if h.Op.IsHandshake() {
			d.auth.onHandshake(from, &h, hdr, payload)
			return
		}
		var ok bool
		if payload, ok = d.auth.verify(from, &h, hdr, payload); !ok {
			return
		}
	} else if h.Op.IsHandshake() {
		d.stats.badMAC.Add(1) // a keyed peer; we have no key
		return
	}
	if h.Op.IsCM() {
		d.cm.onPacket(d, from, &h, payload)
		return
	}
	q := d.rxLookupQP(h.DestQP)
	if q == nil {
		d.stats.noQP.Add(1)
		if h.Op.IsRequest() {
			// Tell the requester at once instead of letting it time out: a
			// DCI learns that the DCT is gone (its peer restarted).
			nh := wire.Header{Op: wire.OpAck, DestQP: h.SrcQP, SrcQP: h.DestQP, PSN: h.PSN,
				Syndrome: wire.SynNAKInv, Reason: uint8(verbs.ReasonNoQP)}
			d.rxOut.add(from, &nh, nil)
		}
		return
	}
	q.mu.Lock()
	if !q.dead {
		q.onRx = true
		if h.Op.IsRequest() {
			q.onRequest(from, &h, payload, &d.rxOut)
		} else {
			q.req.onResponse(from, &h, payload, &d.rxOut)
		}
		q.onRx = false
	}
	q.mu.Unlock()
}

// sendNow sends one packet from outside the receive path.
func (d *Device) sendNow(to netip.AddrPort, h *wire.Header, payload []byte) {
	d.sendMu.Lock()
	d.sendOut.add(to, h, payload)
	d.sendOut.flush(d)
	d.sendMu.Unlock()
}

func randUint64() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// A receive-path probe is probeLen bytes: link.ProbeTag, the device's
// nonce, and a sequence number (little endian). It does not parse as a
// softnic header (the tag's first byte is not wire.Magic), so links
// deliver it whole (and count it as a probe, not as malformed).
const (
	probeTag = link.ProbeTag
	probeLen = len(probeTag) + 16
)

// sendProbe sends the device a probe and returns its sequence number.
// It bypasses packet authentication: the probe never leaves the host,
// and a forged one could only make a timeout count as it would on an
// idle host.
func (d *Device) sendProbe() uint64 {
	seq := d.probesSent.Add(1)
	var b [probeLen]byte
	copy(b[:], probeTag)
	binary.LittleEndian.PutUint64(b[len(probeTag):], d.probeNonce)
	binary.LittleEndian.PutUint64(b[len(probeTag)+8:], seq)
	_ = d.link.Send([]link.Packet{{To: d.probeAddr, Hdr: b[:]}})
	return seq
}

// probeSeen reports whether the receive path has processed probe seq.
func (d *Device) probeSeen(seq uint64) bool { return d.probesSeen.Load() >= seq }

// isProbe consumes a probe of this device.
func (d *Device) isProbe(hdr, payload []byte) bool {
	if len(payload) != 0 || len(hdr) != probeLen || string(hdr[:len(probeTag)]) != probeTag ||
		binary.LittleEndian.Uint64(hdr[len(probeTag):]) != d.probeNonce {
		return false
	}
	seq := binary.LittleEndian.Uint64(hdr[len(probeTag)+8:])
	for {
		seen := d.probesSeen.Load()
		if seq <= seen || d.probesSeen.CompareAndSwap(seen, seq) {
			return true
		}
	}
}

// Quiet implements link.Quiescer: no QP has a send WR outstanding, so no
// completion is owed to anyone who waits without driving (a lingering
// link may leave its socket unwatched).
func (d *Device) Quiet() bool { return d.sendQueued.Load() == 0 }
