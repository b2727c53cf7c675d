package softnic

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// Defaults for QP attributes left zero.
const (
	DefaultMaxSendWR   = 256
	DefaultMaxRecvWR   = 256
	DefaultMaxInline   = 256
	DefaultMaxRdAtomic = 64
	DefaultTimeout     = 8 * time.Millisecond
	DefaultRetryCnt    = 7
	DefaultRNRRetry    = 7 // 7 = retry forever, as in IB
	DefaultMinRNRTimer = 200 * time.Microsecond
	// MaxMsgSize bounds one WR's length.
	MaxMsgSize = 1 << 30
	// MaxMRSize bounds one MR.
	MaxMRSize = 1 << 40
	// ackEvery is how many packets of one message may go unacknowledged
	// before the requester asks for an ACK (ACK coalescing).
	ackEvery = 16
	// windowPSNs bounds the PSNs in flight per QP: four 1 MiB READs at an
	// Ethernet path MTU (about 725 PSNs each).
	windowPSNs = 4096
	// minPathMTU is the smallest payload per packet a QP uses.
	minPathMTU = 256
	// rnrInfinite is the RNRRetry value meaning "retry forever".
	rnrInfinite = 7
)

// qp is a queue pair of any type. Immutable after creation: dev, pd, qpn,
// typ, cqs, srq, caps, dcKey.
type qp struct {
	dev    *Device
	pd     *pd
	qpn    uint32
	typ    verbs.QPType
	sendCQ *cq
	recvCQ *cq
	srq    *srq
	caps   verbs.QPCaps
	dcKey  uint64

	mu    sync.Mutex // guards everything below
	state verbs.QPState
	attr  verbs.QPAttr
	req   requester
	resp  *respCtx                 // RC responder context
	dcts  map[dcInitiator]*respCtx // DCT: transient per-initiator contexts
	rq    []recvWQE                // RC receive queue (without SRQ)
	stats verbs.QPStats
	out   outbox // packets built outside the receive path, sent before mu is released
	onRx  bool   // the receive path is running this QP's handlers (completions wait for rxOut)
	dead  bool
}

var _ verbs.QP = (*qp)(nil)

type recvWQE struct {
	id  uint64
	sge verbs.SGE
	buf []byte
}

// QPN implements verbs.QP. A DCT's number is assigned at RTR (as mlx5
// assigns it), so it is read under the lock.
func (q *qp) QPN() uint32 {
	if q.typ == verbs.DCT {
		q.mu.Lock()
		defer q.mu.Unlock()
	}
	return q.qpn
}
func (q *qp) Type() verbs.QPType { return q.typ }
func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// CreateQP creates a QP in RESET.
func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	d := p.dev
	switch cfg.Type {
	case verbs.RC, verbs.DCI, verbs.DCT:
	default:
		return nil, fmt.Errorf("%w: QP type %v", verbs.ErrInvalidArg, cfg.Type)
	}
	scq, _ := cfg.SendCQ.(*cq)
	rcq, _ := cfg.RecvCQ.(*cq)
	if cfg.Type != verbs.DCT && scq == nil {
		return nil, fmt.Errorf("%w: %v QP needs a send CQ of this device", verbs.ErrInvalidArg, cfg.Type)
	}
	if cfg.Type != verbs.DCI && rcq == nil {
		return nil, fmt.Errorf("%w: %v QP needs a receive CQ of this device", verbs.ErrInvalidArg, cfg.Type)
	}
	if (scq != nil && scq.dev != d) || (rcq != nil && rcq.dev != d) {
		return nil, fmt.Errorf("%w: CQ of another device", verbs.ErrInvalidArg)
	}
	var s *srq
	if cfg.SRQ != nil {
		s, _ = cfg.SRQ.(*srq)
		if s == nil || s.pd != p {
			return nil, fmt.Errorf("%w: SRQ of another protection domain", verbs.ErrWrongPD)
		}
	}
	if cfg.Type == verbs.DCT && s == nil {
		return nil, fmt.Errorf("%w: a DCT needs an SRQ", verbs.ErrInvalidArg)
	}
	caps := cfg.Caps
	if caps.MaxSendWR <= 0 {
		caps.MaxSendWR = DefaultMaxSendWR
	}
	if caps.MaxRecvWR <= 0 {
		caps.MaxRecvWR = DefaultMaxRecvWR
	}
	if caps.MaxInline <= 0 {
		caps.MaxInline = DefaultMaxInline
	}
	if caps.MaxRdAtomic <= 0 {
		caps.MaxRdAtomic = DefaultMaxRdAtomic
	}
	if caps.MaxSendWR > MaxQPWR || caps.MaxRecvWR > MaxQPWR || caps.MaxInline > 4096 {
		return nil, fmt.Errorf("%w: queue caps %+v too large", verbs.ErrInvalidArg, caps)
	}
	q := &qp{dev: d, pd: p, typ: cfg.Type, sendCQ: scq, recvCQ: rcq, srq: s, caps: caps, dcKey: cfg.DCKey}
	q.attr = verbs.QPAttr{PathMTU: d.mtu, Timeout: DefaultTimeout, RetryCnt: DefaultRetryCnt,
		RNRRetry: DefaultRNRRetry, MinRNRTimer: DefaultMinRNRTimer}
	q.req.init(q)
	q.out.auth = d.auth
	if cfg.Type == verbs.DCI {
		d.mu.Lock()
		q.req.nextPSN = wire.PSN(d.rng.Uint32N(wire.PSNMask + 1))
		d.mu.Unlock()
	}
	if cfg.Type == verbs.DCT {
		q.dcts = make(map[dcInitiator]*respCtx)
	} else if cfg.Type == verbs.RC {
		q.resp = &respCtx{}
	}
	if cfg.Type == verbs.DCT {
		// No number before RTR (Modify gives it one), as on mlx5.
		d.mu.RLock()
		closed := d.closed
		d.mu.RUnlock()
		if closed {
			return nil, verbs.ErrClosed
		}
		return q, nil
	}
	if err := d.addQP(q); err != nil {
		return nil, err
	}
	return q, nil
}

// Modify moves the QP to attr.State. Zero attributes keep their current
// value; the transition rules are verbs.ValidTransition (mlx5's, DC
// included), RTR of an RC QP needs RemoteAddr and RemoteQPN, and a DCT
// gets its number at RTR.
func (q *qp) Modify(a verbs.QPAttr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return verbs.ErrDestroyed
	}
	from, to := q.state, a.State
	if !verbs.ValidTransition(q.typ, from, to) {
		return fmt.Errorf("%w: %v -> %v on %v QP %d", verbs.ErrTransition, from, to, q.typ, q.qpn)
	}
	if to == verbs.StateInit && a.Access&verbs.AccessRemoteAtomic != 0 && q.typ != verbs.DCI && q.dev.atomics == verbs.AtomicNone {
		return fmt.Errorf("%w: remote atomic access on a device without atomics", verbs.ErrNotSupported)
	}
	if a.PathMTU != 0 {
		if a.PathMTU < minPathMTU || a.PathMTU > q.dev.maxMTU {
			return fmt.Errorf("%w: path MTU %d outside [%d, %d]", verbs.ErrInvalidArg, a.PathMTU, minPathMTU, q.dev.maxMTU)
		}
	}
	if a.RQPSN > wire.PSNMask || a.SQPSN > wire.PSNMask || a.RemoteQPN > wire.PSNMask {
		return fmt.Errorf("%w: PSN or QPN wider than 24 bits", verbs.ErrInvalidArg)
	}
	if a.RetryCnt < 0 || a.RetryCnt > 7 || a.RNRRetry < 0 || a.RNRRetry > 7 || a.Timeout < 0 || a.MinRNRTimer < 0 {
		return fmt.Errorf("%w: retry counts are 0..7, timers non-negative", verbs.ErrInvalidArg)
	}
	if to == verbs.StateRTR && q.typ == verbs.RC && (!a.RemoteAddr.IsValid() || a.RemoteQPN == 0) {
		return fmt.Errorf("%w: RTR of an RC QP needs the remote address and QPN", verbs.ErrInvalidArg)
	}
	if to == verbs.StateRTR && q.typ == verbs.DCT {
		if err := q.dev.addQP(q); err != nil {
			return err
		}
	}
	switch to {
	case verbs.StateReset:
		q.resetLocked()
	case verbs.StateErr:
		q.toErrLocked()
		q.flushOutLocked()
		return nil
	}
	q.applyAttrLocked(a, to)
	q.state = to
	return nil
}

func (q *qp) applyAttrLocked(a verbs.QPAttr, to verbs.QPState) {
	at := &q.attr
	if a.Access != 0 {
		at.Access = a.Access
	}
	if a.PathMTU != 0 {
		at.PathMTU = a.PathMTU
	}
	if a.Timeout != 0 {
		at.Timeout = a.Timeout
	}
	if a.RetryCnt != 0 || a.Mask&verbs.AttrRetryCnt != 0 {
		at.RetryCnt = a.RetryCnt
	}
	if a.RNRRetry != 0 || a.Mask&verbs.AttrRNRRetry != 0 {
		at.RNRRetry = a.RNRRetry
	}
	if a.MinRNRTimer != 0 {
		at.MinRNRTimer = a.MinRNRTimer
	}
	switch to {
	case verbs.StateRTR:
		if a.RemoteAddr.IsValid() {
			at.RemoteAddr = a.RemoteAddr
			at.RemoteQPN = a.RemoteQPN
		}
		at.RQPSN = a.RQPSN
		if q.resp != nil {
			*q.resp = respCtx{ePSN: wire.PSN(a.RQPSN)}
		}
	case verbs.StateRTS:
		if q.state == verbs.StateRTR {
			if q.typ == verbs.DCI {
				// A DCI's PSNs run on across RESET, so that a DCT always
				// sees its sessions in increasing order; SQPSN is ignored.
				q.req.start(q.req.nextPSN)
			} else {
				q.req.start(wire.PSN(a.SQPSN))
			}
			at.SQPSN = uint32(q.req.nextPSN)
		}
	}
}

// resetLocked returns the QP to RESET: queues emptied without completions,
// as ibv_modify_qp to RESET does.
func (q *qp) resetLocked() {
	q.req.reset()
	q.rq = nil
	if q.resp != nil {
		*q.resp = respCtx{}
	}
	if q.dcts != nil {
		clear(q.dcts)
	}
	keep := q.attr
	q.attr = verbs.QPAttr{PathMTU: keep.PathMTU, Timeout: keep.Timeout, RetryCnt: keep.RetryCnt,
		RNRRetry: keep.RNRRetry, MinRNRTimer: keep.MinRNRTimer, Access: keep.Access}
}

// toErrLocked moves the QP to ERR and flushes its queues: every
// outstanding send WR and posted receive WR completes with WR_FLUSH_ERR.
func (q *qp) toErrLocked() {
	if q.state == verbs.StateErr {
		return
	}
	q.state = verbs.StateErr
	q.stats.Errors++
	q.req.flushAll(verbs.StatusWRFlushErr, verbs.ReasonNone)
	for _, r := range q.rq {
		q.recvCQ.push(verbs.WC{ID: r.id, Status: verbs.StatusWRFlushErr, Op: verbs.OpRecv, QPN: q.qpn})
	}
	q.rq = nil
	if q.srq != nil && q.typ == verbs.RC {
		// It takes no more receives from the SRQ: the last WQE is reached.
		q.dev.raise(verbs.Event{Type: verbs.EventQPLastWQE, QP: q})
	}
}

func (q *qp) flushOutLocked() { q.out.flush(q.dev) }

// PostSend validates every WR before posting any state change for it; the
// first invalid WR stops the batch with a *verbs.PostError. Valid WRs go
// out in one link send (one doorbell).
func (q *qp) PostSend(wrs []verbs.SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return &verbs.PostError{Index: 0, Err: verbs.ErrDestroyed}
	}
	var perr error
	for i := range wrs {
		if err := q.checkSendLocked(&wrs[i]); err != nil {
			perr = &verbs.PostError{Index: i, Err: err}
			break
		}
		q.req.post(&wrs[i])
	}
	if q.state == verbs.StateErr {
		// As on hardware: WRs posted to a QP in ERR complete flushed.
		q.req.flushAll(verbs.StatusWRFlushErr, verbs.ReasonNone)
	} else {
		q.req.progress(&q.out)
	}
	q.flushOutLocked()
	q.req.armIfOutstanding()
	return perr
}

func (q *qp) checkSendLocked(wr *verbs.SendWR) error {
	switch q.state {
	case verbs.StateRTS, verbs.StateErr:
	default:
		return fmt.Errorf("%w: post send in %v", verbs.ErrQPState, q.state)
	}
	if q.typ == verbs.DCT {
		return fmt.Errorf("%w: a DCT has no send queue", verbs.ErrOpcode)
	}
	if q.req.count() >= q.caps.MaxSendWR {
		return fmt.Errorf("%w: %d WRs outstanding", verbs.ErrQueueFull, q.caps.MaxSendWR)
	}
	if q.typ == verbs.DCI {
		t := wr.Target
		if t == nil || !t.Addr.IsValid() || t.DCTN == 0 || t.DCTN > wire.PSNMask {
			return verbs.ErrNoTarget
		}
	}
	inline := wr.Flags&verbs.Inline != 0
	switch wr.Op {
	case verbs.OpRead:
		if inline {
			return fmt.Errorf("%w: inline READ", verbs.ErrInvalidArg)
		}
		if err := checkLen(wr.Local.Length); err != nil {
			return err
		}
		return checkLocal(q.pd, wr.Local, verbs.AccessLocalWrite)
	case verbs.OpWrite, verbs.OpWriteImm, verbs.OpSend, verbs.OpSendImm:
		if inline {
			if len(wr.InlineData) > q.caps.MaxInline {
				return fmt.Errorf("%w: %d inline bytes, max %d", verbs.ErrLength, len(wr.InlineData), q.caps.MaxInline)
			}
			if len(wr.InlineData) == 0 && (wr.Op == verbs.OpWrite || wr.Op == verbs.OpWriteImm) {
				return fmt.Errorf("%w: zero-length inline WRITE", verbs.ErrLength)
			}
			return nil
		}
		if wr.Op == verbs.OpSend || wr.Op == verbs.OpSendImm {
			if wr.Local.MR == nil && wr.Local.Length == 0 {
				return nil // a zero-length SEND carries no data
			}
			if wr.Local.Length > MaxMsgSize {
				return fmt.Errorf("%w: %d bytes, max %d", verbs.ErrLength, wr.Local.Length, MaxMsgSize)
			}
			return checkLocal(q.pd, wr.Local, 0)
		}
		if err := checkLen(wr.Local.Length); err != nil {
			return err
		}
		return checkLocal(q.pd, wr.Local, 0)
	case verbs.OpCmpSwap, verbs.OpFetchAdd:
		if q.dev.atomics == verbs.AtomicNone {
			return fmt.Errorf("%w: %v on a device without atomics", verbs.ErrNotSupported, wr.Op)
		}
		if inline {
			return fmt.Errorf("%w: inline atomic", verbs.ErrInvalidArg)
		}
		if wr.RemoteAddr%verbs.AtomicSize != 0 {
			return fmt.Errorf("%w: remote address %#x", verbs.ErrAlign, wr.RemoteAddr)
		}
		if wr.Local.Length != verbs.AtomicSize {
			return fmt.Errorf("%w: atomic sink must be %d bytes, got %d", verbs.ErrLength, verbs.AtomicSize, wr.Local.Length)
		}
		return checkLocal(q.pd, wr.Local, verbs.AccessLocalWrite)
	}
	return fmt.Errorf("%w: %v", verbs.ErrOpcode, wr.Op)
}

func checkLen(n uint32) error {
	if n == 0 || n > MaxMsgSize {
		return fmt.Errorf("%w: %d bytes (1..%d)", verbs.ErrLength, n, MaxMsgSize)
	}
	return nil
}

// PostRecv posts receive WRs to an RC QP without SRQ.
func (q *qp) PostRecv(wrs []verbs.RecvWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return &verbs.PostError{Index: 0, Err: verbs.ErrDestroyed}
	}
	if q.typ != verbs.RC || q.srq != nil {
		return &verbs.PostError{Index: 0, Err: fmt.Errorf("%w: %v QP receives through its SRQ", verbs.ErrOpcode, q.typ)}
	}
	if q.state == verbs.StateReset {
		return &verbs.PostError{Index: 0, Err: fmt.Errorf("%w: post receive in RESET", verbs.ErrQPState)}
	}
	for i, wr := range wrs {
		if len(q.rq) >= q.caps.MaxRecvWR {
			return &verbs.PostError{Index: i, Err: verbs.ErrQueueFull}
		}
		if wr.Local.MR != nil || wr.Local.Length != 0 {
			if err := checkLocal(q.pd, wr.Local, verbs.AccessLocalWrite); err != nil {
				return &verbs.PostError{Index: i, Err: err}
			}
		}
		if q.state == verbs.StateErr {
			q.recvCQ.push(verbs.WC{ID: wr.ID, Status: verbs.StatusWRFlushErr, Op: verbs.OpRecv, QPN: q.qpn})
			continue
		}
		q.rq = append(q.rq, recvWQE{id: wr.ID, sge: wr.Local, buf: wr.Local.Bytes()})
	}
	return nil
}

func (q *qp) SendQueueFree() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.typ == verbs.DCT {
		return 0
	}
	return q.caps.MaxSendWR - q.req.count()
}

func (q *qp) Info() verbs.QPInfo {
	q.mu.Lock()
	defer q.mu.Unlock()
	info := verbs.QPInfo{QPN: q.qpn, Type: q.typ, State: q.state, Remote: q.attr.RemoteAddr,
		RemoteQPN: q.attr.RemoteQPN, SQPSN: uint32(q.req.nextPSN), Outstand: q.req.count(), Stats: q.stats}
	if q.resp != nil {
		info.RQPSN = uint32(q.resp.ePSN)
	}
	if q.typ == verbs.DCI && q.req.target.Addr.IsValid() {
		info.Remote = q.req.target.Addr
		info.RemoteQPN = q.req.target.DCTN
	}
	return info
}

// Destroy removes the QP. Outstanding WRs are dropped without completions,
// as with ibv_destroy_qp; a receive in progress is waited for.
func (q *qp) Destroy() error {
	d := q.dev
	d.lockRx()
	defer d.rxMu.Unlock()
	d.predictQP.CompareAndSwap(q, nil)
	q.mu.Lock()
	if q.dead {
		q.mu.Unlock()
		return fmt.Errorf("%w: QP %d", verbs.ErrDestroyed, q.qpn)
	}
	q.dead = true
	q.req.reset()
	q.rq = nil
	q.mu.Unlock()
	d.removeQP(q)
	return nil
}

// remoteTarget returns where requests of this QP go.
func (q *qp) remoteTarget() (netip.AddrPort, uint32) {
	if q.typ == verbs.DCI {
		return q.req.target.Addr, q.req.target.DCTN
	}
	return q.attr.RemoteAddr, q.attr.RemoteQPN
}

var _ link.Receiver = (*Device)(nil)
