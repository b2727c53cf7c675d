package softnic

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// swqe is a send work queue entry: a posted WR and its transmission state.
type swqe struct {
	wr     verbs.SendWR
	target verbs.DCTarget
	local  []byte // resolved local memory (nil for inline and empty SENDs)
	mr     *mr
	inline []byte // owned copy of inline data

	assigned bool     // PSNs assigned (first transmission started)
	first    wire.PSN // first PSN
	npkts    uint32   // PSNs the message takes
	mtu      uint32   // path MTU at assignment
	sent     uint32   // request packets transmitted in the current pass
	rsp      uint32   // READ: response packets received in order
	done     bool
	status   verbs.Status
	reason   verbs.Reason
}

func (w *swqe) rdAtomic() bool { return w.wr.Op == verbs.OpRead || w.wr.Op.IsAtomic() }

// length is the message length in bytes.
func (w *swqe) length() uint32 {
	if w.wr.Flags&verbs.Inline != 0 {
		return uint32(len(w.inline))
	}
	if w.wr.Op.IsAtomic() {
		return verbs.AtomicSize
	}
	return w.wr.Local.Length
}

// reqPkts is the number of request packets (READs and atomics send one).
func (w *swqe) reqPkts() uint32 {
	if w.rdAtomic() {
		return 1
	}
	return w.npkts
}

func (w *swqe) last() wire.PSN { return w.first.Add(w.npkts - 1) }

// requester is the send side of a QP: it assigns PSNs, segments messages
// by path MTU, keeps at most windowPSNs in flight, retransmits go-back-N
// from the oldest unacknowledged PSN on timeout, on a sequence NAK, or when
// an ACK implies a lost READ response, and completes WRs in order.
//
// A DCI keeps no per-target state beyond its current session: a WR for
// another target waits until every earlier WR completed, and the first WR
// after the queue drained opens a new session (its PSN is the session PSN
// carried in every DC request), which tells the DCT to drop state of older
// sessions.
//
// All fields are guarded by the owning qp's mu.
type requester struct {
	q  *qp
	sq []*swqe // outstanding WRs in post order; sq[0] is the oldest
	tx int     // index in sq of the WR being transmitted

	nextPSN  wire.PSN // next PSN to assign
	una      wire.PSN // oldest PSN not yet acknowledged (see settle)
	acked    wire.PSN // one past the highest PSN the responder acknowledged
	sentHigh wire.PSN // one past the highest PSN transmitted
	rdOut    int      // READs and atomics assigned and not complete

	retries    int
	uncounted  int    // timeouts since progress not counted in retries (see onTimer)
	probe      uint64 // receive-path probe sent after the last retransmission; 0 if none
	rnrRetries int
	rnrWait    bool
	// The retransmission timer: one per QP, not one per operation. armed
	// says that something transmitted is unacknowledged (the ACK timeout
	// runs from lastProgress); timerPending that a timer is scheduled.
	// Progress and completion only move lastProgress or clear armed; the
	// timer, when it fires early, schedules itself for the deadline that
	// holds then, or lapses when nothing is owed (see timeoutDue).
	timer        link.Timer
	timerPending bool
	onTimerFn    func() // r.onTimer, made once
	armed        bool
	lastProgress time.Time
	gapPSN       wire.PSN // READ response gap already asked for
	gapValid     bool

	target  verbs.DCTarget // DCI: current target
	session wire.PSN       // DCI: current session PSN

	free []*swqe
}

func (r *requester) init(q *qp) {
	r.q = q
	r.onTimerFn = r.onTimer
}

func (r *requester) count() int { return len(r.sq) }

// start sets the first PSN at the RTR->RTS transition.
func (r *requester) start(psn wire.PSN) {
	r.nextPSN, r.una, r.acked, r.sentHigh = psn, psn, psn, psn
	r.retries, r.uncounted, r.probe, r.rnrRetries = 0, 0, 0, 0
}

// reset drops all WRs without completions and stops timers.
func (r *requester) reset() {
	r.stopTimer()
	if r.timerPending && r.timer.Stop() {
		r.timerPending, r.timer = false, nil
	} // else it is running: it finds nothing owed and lapses
	r.q.dev.sendQueued.Add(-int64(len(r.sq)))
	r.sq, r.tx, r.rdOut = nil, 0, 0
	r.rnrWait, r.gapValid = false, false
	r.target = verbs.DCTarget{}
}

// stopTimer ends the ACK timeout: nothing is owed. A scheduled timer is
// left to lapse (stopping it and starting another for the next operation
// cost an allocation and two timer-heap updates per READ).
func (r *requester) stopTimer() {
	r.armed = false
}

func (r *requester) post(wr *verbs.SendWR) {
	var w *swqe
	if n := len(r.free); n > 0 {
		w = r.free[n-1]
		r.free = r.free[:n-1]
		inl := w.inline[:0]
		*w = swqe{inline: inl}
	} else {
		w = &swqe{}
	}
	w.wr = *wr
	if wr.Target != nil {
		w.target = *wr.Target
		w.wr.Target = nil
	}
	w.wr.InlineData = nil
	if wr.Flags&verbs.Inline != 0 {
		w.inline = append(w.inline[:0], wr.InlineData...)
	} else if wr.Local.MR != nil {
		w.mr = wr.Local.MR.(*mr)
		w.local = wr.Local.Bytes()
	}
	r.sq = append(r.sq, w)
	r.q.dev.sendQueued.Add(1)
	if w.wr.Op == verbs.OpRead && len(w.local) > 0 {
		r.q.dev.predictQP.Store(r.q)
	}
}

// progress transmits what the window, the ORD limit, fences and the DCI
// target rule allow into out. It does not start the retransmission timer:
// the caller calls armIfOutstanding once out is on the wire (see there).
func (r *requester) progress(out *outbox) {
	q := r.q
	if q.state != verbs.StateRTS || r.rnrWait {
		return
	}
	for r.tx < len(r.sq) {
		w := r.sq[r.tx]
		if w.done {
			r.tx++ // acknowledged while a retransmission was rewinding
			continue
		}
		if !w.assigned {
			if r.nextPSN.Sub(r.una) >= windowPSNs {
				break
			}
			if w.rdAtomic() && r.rdOut >= q.caps.MaxRdAtomic {
				break
			}
			if w.wr.Flags&verbs.Fence != 0 && r.rdOut > 0 {
				break
			}
			if q.typ == verbs.DCI {
				if r.tx > 0 && w.target != r.target {
					break // one target at a time: wait for earlier WRs to complete
				}
				if r.tx == 0 {
					r.target = w.target
					r.session = r.nextPSN
				}
			}
			w.assigned = true
			w.first = r.nextPSN
			w.mtu = uint32(q.pathMTU(w))
			n := (w.length() + w.mtu - 1) / w.mtu
			if n == 0 || w.wr.Op.IsAtomic() {
				n = 1
			}
			w.npkts = n
			r.nextPSN = r.nextPSN.Add(n)
			if w.rdAtomic() {
				r.rdOut++
			}
		}
		for w.sent < w.reqPkts() {
			psn := w.first.Add(w.sent)
			if w.rdAtomic() {
				psn = w.first.Add(w.rsp)
			}
			if psn.Sub(r.una) >= windowPSNs {
				break
			}
			if w.mr != nil && w.mr.dead.Load() {
				r.failFrom(r.tx, verbs.StatusLocProtErr, verbs.ReasonNone)
				return
			}
			r.emit(w, out)
			w.sent++
		}
		if w.sent < w.reqPkts() {
			break
		}
		r.tx++
	}
}

// armIfOutstanding starts the retransmission timer if a transmitted PSN
// is not acknowledged. Call it after the packets that progress built were
// handed to the link, as a NIC starts its ACK timer when a packet leaves:
// on a manual clock driven by another goroutine, a timer that exists
// before its packet could otherwise fire first and count a retry for a
// packet the network has not even seen.
func (r *requester) armIfOutstanding() {
	if r.q.state == verbs.StateRTS && r.una.Less(r.sentHigh) {
		r.arm()
	}
}

// pathMTU is the payload per packet for w: the QP's path MTU, lowered so
// that every packet of w (for a READ, every response) fits the route to the
// peer unfragmented, whatever headers it carries.
func (q *qp) pathMTU(w *swqe) int {
	to, _ := q.remoteTarget()
	hdr := wire.MaxHeaderLen // requests: any combination of extension headers
	if w.wr.Op == verbs.OpRead {
		hdr = wire.BaseLen + wire.AETHLen // READ responses
		if q.dev.auth != nil {
			hdr += wire.AuthETHLen
		}
	}
	hdr += q.dev.auth.overhead()
	mtu := q.attr.PathMTU
	if fit := q.dev.link.MaxDatagramTo(to) - hdr; fit < mtu {
		mtu = max(fit, minPathMTU)
	}
	return mtu
}

// emit encodes request packet w.sent of w (for a READ: the request for the
// responses not yet received).
func (r *requester) emit(w *swqe, out *outbox) {
	q := r.q
	to, dest := q.remoteTarget()
	h := wire.Header{DestQP: dest, SrcQP: q.qpn}
	if q.typ == verbs.DCI {
		h.Flags |= wire.FlagDC
		h.DCKey = w.target.DCKey
		h.SessionPSN = uint32(r.session)
	}
	var payload []byte
	switch w.wr.Op {
	case verbs.OpRead:
		off := w.rsp * w.mtu
		h.Op = wire.OpReadReq
		h.PSN = uint32(w.first.Add(w.rsp))
		h.Flags |= wire.FlagFirst | wire.FlagLast
		h.VA = w.wr.RemoteAddr + uint64(off)
		h.RKey = w.wr.RKey
		h.DMALen = w.length() - off
		h.RespMTU = w.mtu
	case verbs.OpCmpSwap, verbs.OpFetchAdd:
		h.Op = wire.OpCmpSwap
		if w.wr.Op == verbs.OpFetchAdd {
			h.Op = wire.OpFetchAdd
		}
		h.PSN = uint32(w.first)
		h.Flags |= wire.FlagFirst | wire.FlagLast | wire.FlagAckReq
		h.VA = w.wr.RemoteAddr
		h.RKey = w.wr.RKey
		if w.wr.Op == verbs.OpCmpSwap {
			h.Swap, h.Cmp = w.wr.Swap, w.wr.CompareAdd
		} else {
			h.Swap = w.wr.CompareAdd
		}
	default:
		i := w.sent
		h.PSN = uint32(w.first.Add(i))
		h.Op = wire.OpSend
		if w.wr.Op == verbs.OpWrite || w.wr.Op == verbs.OpWriteImm {
			h.Op = wire.OpWrite
		}
		if i == 0 {
			h.Flags |= wire.FlagFirst
			if h.Op == wire.OpWrite {
				h.VA = w.wr.RemoteAddr
				h.RKey = w.wr.RKey
				h.DMALen = w.length()
			}
		}
		if i == w.npkts-1 {
			h.Flags |= wire.FlagLast | wire.FlagAckReq
			if w.wr.Op == verbs.OpWriteImm || w.wr.Op == verbs.OpSendImm {
				h.Flags |= wire.FlagImm
				h.Imm = w.wr.Imm
			}
			if w.wr.Flags&verbs.Solicited != 0 && h.Op == wire.OpSend {
				h.Flags |= wire.FlagSolicited
			}
		} else if (i+1)%ackEvery == 0 {
			h.Flags |= wire.FlagAckReq
		}
		src := w.local
		if w.wr.Flags&verbs.Inline != 0 {
			src = w.inline
		}
		lo := uint64(i) * uint64(w.mtu)
		hi := min(lo+uint64(w.mtu), uint64(len(src)))
		if lo < hi {
			payload = src[lo:hi]
		}
	}
	end := wire.PSN(h.PSN).Add(1)
	if h.Op == wire.OpReadReq {
		end = w.first.Add(w.npkts)
	}
	if r.sentHigh.Less(end) {
		r.sentHigh = end
	} else {
		q.stats.Retransmits++
		q.dev.stats.retransmits.Add(1)
	}
	q.stats.TxPackets++
	q.stats.TxBytes += uint64(len(payload))
	out.add(to, &h, payload)
}

func (r *requester) arm() {
	if r.armed {
		return
	}
	r.armed = true
	r.lastProgress = r.q.dev.clock.Now()
	if !r.timerPending {
		r.timerPending = true
		r.timer = r.q.dev.clock.AfterFunc(r.q.attr.Timeout, r.onTimerFn)
	}
}

// timeoutDue is the first step of the timer's callback, with q.mu held:
// it reports whether the ACK timeout has come. If not, the timer is
// scheduled again for the deadline that holds now (progress moved it), or
// lapses when nothing is owed.
func (r *requester) timeoutDue() bool {
	q := r.q
	if !r.armed || q.dead || q.state != verbs.StateRTS || r.rnrWait || !r.una.Less(r.sentHigh) {
		// Nothing owed, the QP is gone, or the RNR timer owns the next step.
		r.armed, r.timerPending, r.timer = false, false, nil
		return false
	}
	if wait := r.lastProgress.Add(q.attr.Timeout).Sub(q.dev.clock.Now()); wait > 0 {
		r.timer = q.dev.clock.AfterFunc(wait, r.onTimerFn)
		return false
	}
	return true
}

// MaxUncountedTimeouts bounds the ACK timeouts in a row that do not count
// against a QP's RetryCnt because the device's own receive path had not
// caught up or its host was stalled (see onTimer).
const MaxUncountedTimeouts = 16

// onTimer runs on the clock's goroutine when no PSN was acknowledged for
// the ACK timeout: it retransmits go-back-N from una, and counts a retry.
//
// As on InfiniBand, RetryCnt+1 timeouts in a row without progress fail
// the oldest WR with RETRY_EXC_ERR and the QP goes to ERR. A NIC's
// receive pipeline never falls behind, so its timeout always means that
// the peer or the network did not answer. Ours is software and can: on a
// host whose CPUs are busy, an ACK may sit unprocessed in the device's
// own socket while the timer fires. So after each retransmission on
// timeout the device sends itself a probe datagram, and the next timeout
// counts only if the probe has come back through the receive path (which
// then processed everything that arrived before it). Nor does a timeout
// count that fires more than a whole Timeout after its deadline: the host
// itself was stalled for longer than the peer was given to answer, and
// so was every peer on the same host (a test's, or the meta server's
// loopback QP). Such a timeout retransmits without counting. At most
// MaxUncountedTimeouts timeouts in a row go uncounted, so a WR to a dead
// peer fails after RetryCnt+1 timeouts without progress when the host
// keeps up, and after at most RetryCnt+1+MaxUncountedTimeouts (24 with the
// default RetryCnt 7) when it does not or a probe is lost.
//
// A timeout takes the device's receive lock first (lock order rxMu ->
// qp.mu) because failing the QP completes READs whose buffers a receive
// may be steering payload into.
func (r *requester) onTimer() {
	q := r.q
	d := q.dev
	// Most firings find the deadline moved by progress, or nothing owed:
	// they need only the QP's lock. A timeout takes the receive lock too,
	// first (lock order rxMu -> qp.mu), and looks again.
	q.mu.Lock()
	due := r.timeoutDue()
	q.mu.Unlock()
	if !due {
		return
	}
	d.lockRx()
	defer d.rxMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if !r.timeoutDue() {
		return
	}
	r.armed, r.timerPending, r.timer = false, false, nil
	wait := r.lastProgress.Add(q.attr.Timeout).Sub(d.clock.Now())
	q.stats.Timeouts++
	behind := r.probe != 0 && !d.probeSeen(r.probe) // an answer may wait in our own receive queue
	stalled := -wait > q.attr.Timeout               // this timer ran a whole Timeout late
	if (behind || stalled) && r.uncounted < MaxUncountedTimeouts {
		r.uncounted++
	} else {
		r.retries++
	}
	if r.retries > q.attr.RetryCnt {
		r.failFrom(0, verbs.StatusRetryExcErr, verbs.ReasonRemoteDown)
		q.flushOutLocked()
		return
	}
	r.goBackN(r.una)
	r.progress(&q.out)
	q.flushOutLocked()
	r.probe = d.sendProbe()
	r.armIfOutstanding()
}

// goBackN rewinds transmission to the WR holding psn.
func (r *requester) goBackN(psn wire.PSN) {
	for i := 0; i < len(r.sq) && i <= r.tx; i++ {
		w := r.sq[i]
		if !w.assigned || w.done {
			continue
		}
		if psn.Less(w.first) {
			psn = w.first
		}
		if !w.last().Less(psn) {
			// w holds psn: rewind to it, and every later WR to its start.
			if w.rdAtomic() {
				w.sent = 0
			} else {
				w.sent = uint32(psn.Sub(w.first))
			}
			for j := i + 1; j < len(r.sq) && j <= r.tx; j++ {
				if r.sq[j].assigned {
					r.sq[j].sent = 0
				}
			}
			r.tx = i
			return
		}
	}
}

// ackUpTo records that the responder executed every PSN up to and
// including a (for a READ, that it answered up to a), then settles the
// queue.
func (r *requester) ackUpTo(a wire.PSN) {
	next := a.Add(1)
	if r.sentHigh.Less(next) {
		return // acknowledges something never sent
	}
	progressed := r.acked.Less(next)
	if progressed {
		r.acked = next
		r.retries, r.uncounted, r.probe, r.rnrRetries = 0, 0, 0, 0
	}
	r.settle()
	// Progress restarts the ACK timeout of what is still owed; when
	// nothing is, the timer lapses and the next arm reads the clock.
	// ackUpTo runs in the receive path (onResponse, rxMu held): the
	// batch's clock reading is the progress's time.
	if progressed && r.una.Less(r.sentHigh) {
		r.lastProgress = r.q.dev.rxClock()
	}
}

// settle marks done every WR below acked that needs nothing more: SENDs
// and WRITEs, READs with all their responses, atomics with their result.
// A READ or atomic below acked whose response is missing was executed
// and its answer lost, so it is requested again (an implied NAK, once per
// gap). una becomes the first PSN still owed: the first missing response
// of such a READ or atomic, else acked. So una reaches sentHigh exactly
// when every transmitted WR is done, and the retransmission timer never
// runs for a queue that owes nothing (else a READ's lost response
// repaired after a later READ completed would leave una behind sentHigh
// once the queue drained, and an idle QP would time out into ERR).
func (r *requester) settle() {
	una := r.acked
	gap := false
	for _, w := range r.sq {
		if !w.assigned || !w.last().Less(r.acked) {
			break
		}
		if w.done {
			continue
		}
		if !w.rdAtomic() {
			w.done = true
			continue
		}
		if gap {
			continue // asked again by the goBackN of the first gap
		}
		gap = true
		// Nothing from its first missing response on counts as
		// acknowledged until that response arrives.
		p := w.first.Add(w.rsp)
		una = p
		if !r.gapValid || r.gapPSN != p {
			r.gapPSN, r.gapValid = p, true
			r.goBackN(p)
		}
	}
	r.una = una
}

// complete pops finished WRs from the head of the queue in order.
func (r *requester) complete() {
	q := r.q
	n := 0
	for n < len(r.sq) && r.sq[n].done {
		w := r.sq[n]
		if w.rdAtomic() {
			r.rdOut--
		}
		if w.wr.Flags&verbs.Signaled != 0 || w.status != verbs.StatusSuccess {
			q.stats.Completions++
			q.dev.pushWC(q, q.sendCQ, verbs.WC{ID: w.wr.ID, Status: w.status, Reason: w.reason, Op: w.wr.Op,
				QPN: q.qpn, ByteLen: w.length()})
		}
		r.recycle(w)
		n++
	}
	if n > 0 {
		copy(r.sq, r.sq[n:])
		clear(r.sq[len(r.sq)-n:])
		r.sq = r.sq[:len(r.sq)-n]
		r.q.dev.sendQueued.Add(-int64(n))
		r.tx -= n
		if r.tx < 0 {
			r.tx = 0
		}
	}
	if len(r.sq) == 0 || !r.una.Less(r.sentHigh) {
		r.stopTimer()
	}
}

func (r *requester) recycle(w *swqe) {
	w.local, w.mr, w.wr = nil, nil, verbs.SendWR{}
	if len(r.free) < 64 {
		r.free = append(r.free, w)
	}
}

// failFrom completes WR i with status and reason, moves the QP to ERR and
// flushes everything after it.
func (r *requester) failFrom(i int, st verbs.Status, why verbs.Reason) {
	q := r.q
	for j := 0; j < i && j < len(r.sq); j++ {
		if w := r.sq[j]; !w.done {
			// Executed by the responder before the failure, but a READ or
			// atomic whose response is missing has no result to report.
			w.done = true
			if w.rdAtomic() {
				w.status = verbs.StatusWRFlushErr
			}
		}
	}
	if i < len(r.sq) {
		w := r.sq[i]
		w.done, w.status, w.reason = true, st, why
	}
	r.complete()
	q.toErrLocked()
}

// flushAll completes every outstanding WR with st.
func (r *requester) flushAll(st verbs.Status, why verbs.Reason) {
	for _, w := range r.sq {
		w.done, w.status, w.reason = true, st, why
	}
	r.complete()
	r.reset()
}

// find returns the index of the outstanding WR holding psn, or -1.
func (r *requester) find(psn wire.PSN) int {
	for i := 0; i < len(r.sq) && i <= r.tx; i++ {
		w := r.sq[i]
		if !w.assigned {
			return -1
		}
		if psn.Less(w.first) {
			return -1
		}
		if !w.last().Less(psn) {
			return i
		}
	}
	return -1
}

// fromPeer reports whether a response came from this QP's peer.
func (r *requester) fromPeer(from netip.AddrPort, h *wire.Header) bool {
	q := r.q
	if q.typ == verbs.DCI {
		return from == r.target.Addr && h.SrcQP == r.target.DCTN
	}
	return from == q.attr.RemoteAddr && h.SrcQP == q.attr.RemoteQPN
}

// predict fills p with the expected next READ response packets: those of
// the oldest READ in progress, from the first one not yet received (a
// datagram never mixes two READs' responses, whose last packets differ
// in size). Only a READ into private memory (see mr.private) is
// predicted: a wrong guess leaves another datagram's bytes in the
// destination until the READ's own response replaces them, which only the
// READ's owner could see, and only before the READ completes.
func (r *requester) predict(p []link.Prediction) int {
	hl := (&wire.Header{Op: wire.OpReadResp}).Len()
	for i := 0; i < len(r.sq) && i <= r.tx; i++ {
		w := r.sq[i]
		if !w.assigned {
			return 0
		}
		if w.wr.Op != verbs.OpRead || w.done || w.rsp >= w.npkts {
			continue
		}
		if w.mr == nil || w.mr.dead.Load() || !w.mr.private.Load() || w.mtu == 0 {
			return 0 // only memory no peer can see may take a guess
		}
		n := 0
		for k := w.rsp; k < w.npkts && n < len(p); k++ {
			off := uint64(k) * uint64(w.mtu)
			end := min(off+uint64(w.mtu), uint64(len(w.local)))
			if off >= end {
				break
			}
			p[n] = link.Prediction{HdrLen: hl, Payload: w.local[off:end]}
			n++
		}
		return n
	}
	return 0
}

// steer returns where the READ response packet index of a received batch
// should land, or nil. Only bytes not yet received, of private memory, are
// handed out.
func (r *requester) steer(from netip.AddrPort, h *wire.Header, index, plen int) []byte {
	if h.Op != wire.OpReadResp || r.q.state != verbs.StateRTS || !r.fromPeer(from, h) {
		return nil
	}
	psn := wire.PSN(h.PSN).Add(uint32(index))
	i := r.find(psn)
	if i < 0 {
		return nil
	}
	w := r.sq[i]
	if w.wr.Op != verbs.OpRead || w.done || psn.Less(w.first.Add(w.rsp)) || w.mr.dead.Load() || !w.mr.private.Load() {
		return nil
	}
	off := uint64(psn.Sub(w.first)) * uint64(w.mtu)
	if off+uint64(plen) > uint64(len(w.local)) {
		return nil
	}
	return w.local[off : off+uint64(plen)]
}

// onResponse handles ACK, NAK, READ response and atomic ACK packets.
func (r *requester) onResponse(from netip.AddrPort, h *wire.Header, payload []byte, out *outbox) {
	q := r.q
	if q.state != verbs.StateRTS || !r.fromPeer(from, h) {
		return
	}
	q.stats.RxPackets++
	q.stats.RxBytes += uint64(len(payload))
	psn := wire.PSN(h.PSN)
	switch h.Syndrome {
	case wire.SynAck:
	case wire.SynNAKSeq:
		q.stats.NAKSeqRx++
		r.ackUpTo(psn.Add(wire.PSNMask)) // psn-1
		if !psn.Less(r.una) && !r.sentHigh.Less(psn) && r.una.Less(r.sentHigh) {
			// From the first PSN owed: psn, or a READ response lost
			// before it. (A NAK for a PSN below una is stale.)
			r.goBackN(r.una)
		}
		r.complete()
		r.progress(out)
		r.armIfOutstanding()
		return
	case wire.SynRNR:
		q.stats.RNRNAKRx++
		r.ackUpTo(psn.Add(wire.PSNMask))
		r.complete()
		r.rnrRetries++
		if q.attr.RNRRetry != rnrInfinite && r.rnrRetries > q.attr.RNRRetry {
			if i := r.find(psn); i >= 0 {
				r.failFrom(i, verbs.StatusRNRRetryExcErr, verbs.ReasonNone)
			}
			return
		}
		r.goBackN(r.una) // psn, or a READ response lost before it
		r.rnrWait = true
		r.stopTimer()
		wait := time.Duration(h.RNRTimer) * time.Microsecond
		q.dev.clock.AfterFunc(wait, r.onRNRTimer)
		return
	default:
		q.stats.ErrNAKRx++
		r.ackUpTo(psn.Add(wire.PSNMask))
		i := r.find(psn)
		if i < 0 {
			return
		}
		st := verbs.StatusRemAccessErr
		switch h.Syndrome {
		case wire.SynNAKInv:
			st = verbs.StatusRemInvReqErr
		case wire.SynNAKOp:
			st = verbs.StatusRemOpErr
		}
		r.failFrom(i, st, verbs.Reason(h.Reason))
		return
	}
	switch h.Op {
	case wire.OpAck:
		r.ackUpTo(psn)
	case wire.OpReadResp:
		i := r.find(psn)
		if i < 0 {
			return // a duplicate of a completed READ
		}
		w := r.sq[i]
		if w.wr.Op != verbs.OpRead || w.done {
			return
		}
		if w.mr.dead.Load() {
			// The sink was deregistered while the READ was in flight: as on
			// hardware, a local protection error, and nothing is written.
			r.failFrom(i, verbs.StatusLocProtErr, verbs.ReasonNone)
			return
		}
		expect := w.first.Add(w.rsp)
		if psn != expect {
			if expect.Less(psn) && (!r.gapValid || r.gapPSN != expect) {
				// A response packet was lost: ask again from it.
				r.gapPSN, r.gapValid = expect, true
				r.goBackN(expect)
				r.progress(out)
				r.armIfOutstanding()
			}
			return
		}
		off := uint64(w.rsp) * uint64(w.mtu)
		want := min(uint64(w.mtu), uint64(len(w.local))-off)
		if uint64(len(payload)) != want {
			return // malformed for this READ: drop, the retry repairs it
		}
		dst := w.local[off : off+want]
		if !samePlace(dst, payload) {
			if q.dev.clobbersLater(dst) {
				return
			}
			copy(dst, payload)
			if len(payload) > 0 {
				q.dev.stats.misplaced.Add(1)
			}
		}
		w.rsp++
		r.gapValid = false
		if w.rsp == w.npkts {
			w.done = true
		}
		// Every PSN before this response was executed, and this one
		// answered.
		r.ackUpTo(psn)
	case wire.OpAtomicAck:
		i := r.find(psn)
		if i < 0 {
			return
		}
		w := r.sq[i]
		if !w.wr.Op.IsAtomic() || w.done {
			return
		}
		if w.mr.dead.Load() {
			r.failFrom(i, verbs.StatusLocProtErr, verbs.ReasonNone)
			return
		}
		binary.NativeEndian.PutUint64(w.local, h.Orig)
		w.rsp = 1
		w.done = true
		r.ackUpTo(psn)
	default:
		return
	}
	r.complete()
	r.progress(out)
	r.armIfOutstanding()
	if debugCheck != nil {
		// A copy: handing the hook h itself would make every received
		// header escape to the heap, a test hook costing production an
		// allocation per packet.
		hc := *h
		debugCheck(r, &hc)
	}
}

// debugCheck, set by tests, verifies requester invariants after each
// response.
var debugCheck func(r *requester, h *wire.Header)

func (r *requester) onRNRTimer() {
	q := r.q
	q.dev.lockRx()
	defer q.dev.rxMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if !r.rnrWait {
		return
	}
	r.rnrWait = false
	if q.dead || q.state != verbs.StateRTS {
		return
	}
	r.progress(&q.out)
	q.flushOutLocked()
	r.armIfOutstanding()
}

// samePlace reports whether two slices are the same memory.
func samePlace(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
