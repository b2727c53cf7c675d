package softnic

import (
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// atomicReplayLen is how many executed atomics a responder context
// remembers, so that a retransmitted atomic is answered with its original
// value instead of executing twice. It must cover the initiator's
// MaxRdAtomic.
const atomicReplayLen = 128

type atomicReplay struct {
	psn   wire.PSN
	orig  uint64
	valid bool
}

// dcInitiator identifies a DCI talking to a DCT.
type dcInitiator struct {
	addr netip.AddrPort
	qpn  uint32
}

// respCtx is the responder state for one requester: an RC QP's peer, or
// one DCI's current session at a DCT. Guarded by the owning qp's mu.
type respCtx struct {
	ePSN       wire.PSN // next PSN expected
	msn        uint32   // messages completed
	nakSeqSent bool     // a sequence NAK was sent for ePSN

	// Message in progress.
	inMsg bool
	msgOp wire.Opcode
	wmem  []byte // WRITE target, the whole message
	woff  int
	rcv   recvWQE // SEND receive buffer
	roff  int

	atomics [atomicReplayLen]atomicReplay
	atomicN int

	// ACK coalescing: index of this context's pending ACK in the device's
	// receive outbox, valid while ackGen equals the outbox generation.
	ackIdx int
	ackGen uint64

	// DCT only.
	session  wire.PSN
	lastUsed time.Time
}

// MaxDCTContexts bounds the transient per-initiator state of one DCT.
// Contexts idle longer than dctIdle are reclaimed; when all are busy, new
// initiators get an RNR NAK and retry.
const (
	MaxDCTContexts = 4096
	dctIdle        = 5 * time.Second
)

// dctContext finds or creates the context of the DCI behind a request,
// applying DC session rules. It returns nil when the packet is stale or
// the table is full (then rnr is set). It runs on the receive path (rxMu
// held), so the idle clock is the batch's reading (rxClock).
func (q *qp) dctContext(from netip.AddrPort, h *wire.Header, create bool) (c *respCtx, rnr bool) {
	key := dcInitiator{from, h.SrcQP}
	sess := wire.PSN(h.SessionPSN)
	c = q.dcts[key]
	now := q.dev.rxClock()
	if c != nil {
		switch {
		case c.session == sess:
		case now.Sub(c.lastUsed) > dctIdle:
			// Idle so long that session PSNs may have wrapped: start over.
			if !create {
				return nil, false
			}
			*c = respCtx{ePSN: sess, session: sess}
		case c.session.Less(sess):
			if !create {
				return nil, false
			}
			*c = respCtx{ePSN: sess, session: sess}
		default:
			return nil, false // a packet of an older session
		}
	} else {
		if !create {
			return nil, false
		}
		if len(q.dcts) >= MaxDCTContexts && !q.reclaimDCT() {
			return nil, true
		}
		c = &respCtx{ePSN: sess, session: sess}
		q.dcts[key] = c
	}
	c.lastUsed = now
	return c, false
}

// reclaimDCT drops idle contexts; it reports whether room was made.
func (q *qp) reclaimDCT() bool {
	now := q.dev.clock.Now()
	for k, c := range q.dcts {
		if now.Sub(c.lastUsed) > dctIdle {
			delete(q.dcts, k)
		}
	}
	return len(q.dcts) < MaxDCTContexts
}

// onRequest is the responder: it executes in-order requests exactly once,
// answers duplicates from state (SEND and WRITE re-ACKed, READ re-served,
// atomics answered from the replay cache), NAKs a PSN gap once, and NAKs
// invalid or forbidden requests.
func (q *qp) onRequest(from netip.AddrPort, h *wire.Header, payload []byte, out *outbox) {
	var c *respCtx
	switch q.typ {
	case verbs.RC:
		if (q.state != verbs.StateRTR && q.state != verbs.StateRTS) || from != q.attr.RemoteAddr || h.SrcQP != q.attr.RemoteQPN || h.Flags&wire.FlagDC != 0 {
			return
		}
		c = q.resp
	case verbs.DCT:
		if q.state != verbs.StateRTR || h.Flags&wire.FlagDC == 0 {
			return
		}
		if h.DCKey != q.dcKey {
			q.stats.DCKeyRejects++
			q.dev.stats.dcKeyRejects.Add(1)
			q.nak(from, h, wire.SynNAKInv, verbs.ReasonDCKey, out)
			return
		}
		var rnr bool
		c, rnr = q.dctContext(from, h, true)
		if c == nil {
			if rnr {
				q.rnrNAK(from, h, out)
			}
			return
		}
	default:
		return
	}
	q.stats.RxPackets++
	q.stats.RxBytes += uint64(len(payload))
	psn := wire.PSN(h.PSN)
	if d := psn.Sub(c.ePSN); d > 0 {
		if !c.nakSeqSent {
			c.nakSeqSent = true
			q.stats.NAKSeqSent++
			q.send(from, h.SrcQP, &wire.Header{Op: wire.OpAck, PSN: uint32(c.ePSN), Syndrome: wire.SynNAKSeq, MSN: c.msn & wire.PSNMask}, nil, out)
		}
		return
	} else if d < 0 {
		q.stats.Duplicates++
		q.duplicate(c, from, h, out)
		return
	}
	c.nakSeqSent = false
	switch h.Op {
	case wire.OpWrite:
		q.execWrite(c, from, h, payload, out)
	case wire.OpSend:
		q.execSend(c, from, h, payload, out)
	case wire.OpReadReq:
		if c.inMsg {
			q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonInvalidOp, out)
			return
		}
		mem, why := q.remoteMem(h.RKey, h.VA, uint64(h.DMALen), verbs.AccessRemoteRead)
		if why != verbs.ReasonNone {
			q.nakErr(c, from, h, synFor(why), why, out)
			return
		}
		if !q.readShapeOK(h) {
			q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonInvalidOp, out)
			return
		}
		c.msn++
		q.serveRead(c, from, h, mem, out)
		c.ePSN = psn.Add(readPkts(h.DMALen, h.RespMTU))
	case wire.OpCmpSwap, wire.OpFetchAdd:
		if c.inMsg {
			q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonInvalidOp, out)
			return
		}
		if h.VA%verbs.AtomicSize != 0 {
			q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonAlign, out)
			return
		}
		mem, why := q.remoteMem(h.RKey, h.VA, verbs.AtomicSize, verbs.AccessRemoteAtomic)
		if why != verbs.ReasonNone {
			q.nakErr(c, from, h, synFor(why), why, out)
			return
		}
		q.dev.beforeMemWrite(out)
		orig := q.dev.execAtomic(mem, h.Op, h.Swap, h.Cmp)
		c.atomics[c.atomicN%atomicReplayLen] = atomicReplay{psn: psn, orig: orig, valid: true}
		c.atomicN++
		c.msn++
		c.ePSN = psn.Add(1)
		q.send(from, h.SrcQP, &wire.Header{Op: wire.OpAtomicAck, PSN: uint32(psn), Syndrome: wire.SynAck, MSN: c.msn & wire.PSNMask, Orig: orig}, nil, out)
	}
}

func readPkts(n, mtu uint32) uint32 {
	if n == 0 {
		return 1
	}
	return (n + mtu - 1) / mtu
}

func synFor(why verbs.Reason) wire.Syndrome {
	switch why {
	case verbs.ReasonRKey, verbs.ReasonBounds, verbs.ReasonPerm:
		return wire.SynNAKAccess
	case verbs.ReasonRecvLen:
		return wire.SynNAKOp
	}
	return wire.SynNAKInv
}

// remoteMem checks a remote access against the QP's access flags and the
// MR behind rkey.
func (q *qp) remoteMem(rkey uint32, va, n uint64, need verbs.Access) ([]byte, verbs.Reason) {
	if q.attr.Access&need != need {
		return nil, verbs.ReasonPerm
	}
	return remoteCheck(q.pd, q.dev.lookupRKey(rkey), va, n, need)
}

func (q *qp) execWrite(c *respCtx, from netip.AddrPort, h *wire.Header, payload []byte, out *outbox) {
	if h.Flags&wire.FlagFirst != 0 {
		if c.inMsg {
			q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonInvalidOp, out)
			return
		}
		mem, why := q.remoteMem(h.RKey, h.VA, uint64(h.DMALen), verbs.AccessRemoteWrite)
		if why != verbs.ReasonNone {
			q.nakErr(c, from, h, synFor(why), why, out)
			return
		}
		c.inMsg, c.msgOp, c.wmem, c.woff = true, wire.OpWrite, mem, 0
	} else if !c.inMsg || c.msgOp != wire.OpWrite {
		q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonInvalidOp, out)
		return
	}
	last := h.Flags&wire.FlagLast != 0
	if c.woff+len(payload) > len(c.wmem) || (last && c.woff+len(payload) != len(c.wmem)) {
		q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonBounds, out)
		return
	}
	var rcv recvWQE
	if last && h.Flags&wire.FlagImm != 0 {
		var ok bool
		if rcv, ok = q.takeRecv(); !ok {
			q.rnrNAK(from, h, out)
			return
		}
	}
	if dst := c.wmem[c.woff : c.woff+len(payload)]; len(dst) > 0 {
		// The payload was received into the link's scratch: WRITE targets
		// are never predicted (see Device.Predict). This copy, after the
		// header was checked, is what keeps other packets' bytes out of
		// memory peers and local programs see.
		q.dev.beforeMemWrite(out)
		copy(dst, payload)
		q.dev.stats.writeCopied.Add(uint64(len(dst)))
	}
	c.woff += len(payload)
	c.ePSN = wire.PSN(h.PSN).Add(1)
	if last {
		c.inMsg, c.wmem = false, nil
		c.msn++
		if h.Flags&wire.FlagImm != 0 {
			q.recvCQ.push(verbs.WC{ID: rcv.id, Op: verbs.OpRecvWriteImm, QPN: q.qpn, ByteLen: uint32(c.woff),
				Imm: h.Imm, HasImm: true, SrcAddr: from, SrcQPN: h.SrcQP})
		}
	}
	if h.Flags&wire.FlagAckReq != 0 {
		q.ack(c, from, h.SrcQP, out)
	}
}

func (q *qp) execSend(c *respCtx, from netip.AddrPort, h *wire.Header, payload []byte, out *outbox) {
	if h.Flags&wire.FlagFirst != 0 {
		if c.inMsg {
			q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonInvalidOp, out)
			return
		}
		rcv, ok := q.takeRecv()
		if !ok {
			q.rnrNAK(from, h, out)
			return
		}
		c.inMsg, c.msgOp, c.rcv, c.roff = true, wire.OpSend, rcv, 0
	} else if !c.inMsg || c.msgOp != wire.OpSend {
		q.nakErr(c, from, h, wire.SynNAKInv, verbs.ReasonInvalidOp, out)
		return
	}
	if dst := c.rcv.buf[min(c.roff, len(c.rcv.buf)):min(c.roff+len(payload), len(c.rcv.buf))]; q.dev.clobbersLater(dst) {
		if h.Flags&wire.FlagFirst != 0 {
			q.returnRecv(c.rcv)
			c.inMsg = false
		}
		return
	}
	if c.roff+len(payload) > len(c.rcv.buf) {
		q.recvCQ.push(verbs.WC{ID: c.rcv.id, Status: verbs.StatusLocLenErr, Reason: verbs.ReasonRecvLen, Op: verbs.OpRecv,
			QPN: q.qpn, SrcAddr: from, SrcQPN: h.SrcQP})
		c.inMsg = false
		q.nakErr(c, from, h, wire.SynNAKOp, verbs.ReasonRecvLen, out)
		return
	}
	if dst := c.rcv.buf[c.roff : c.roff+len(payload)]; !samePlace(dst, payload) {
		q.dev.beforeMemWrite(out)
		copy(dst, payload)
	}
	c.roff += len(payload)
	c.ePSN = wire.PSN(h.PSN).Add(1)
	if h.Flags&wire.FlagLast != 0 {
		c.inMsg = false
		c.msn++
		q.recvCQ.push(verbs.WC{ID: c.rcv.id, Op: verbs.OpRecv, QPN: q.qpn, ByteLen: uint32(c.roff),
			Imm: h.Imm, HasImm: h.Flags&wire.FlagImm != 0, SrcAddr: from, SrcQPN: h.SrcQP})
		c.rcv = recvWQE{}
	}
	if h.Flags&wire.FlagAckReq != 0 {
		q.ack(c, from, h.SrcQP, out)
	}
}

// returnRecv puts back a receive WR taken for a message that was then
// dropped, at the head of its queue.
func (q *qp) returnRecv(r recvWQE) {
	if q.srq != nil {
		q.srq.putBack(r)
		return
	}
	q.rq = append([]recvWQE{r}, q.rq...)
}

// takeRecv consumes the next posted receive WR (SRQ or RQ).
func (q *qp) takeRecv() (recvWQE, bool) {
	if q.srq != nil {
		return q.srq.take()
	}
	if len(q.rq) == 0 {
		return recvWQE{}, false
	}
	r := q.rq[0]
	copy(q.rq, q.rq[1:])
	q.rq = q.rq[:len(q.rq)-1]
	return r, true
}

// readShapeOK reports whether a READ request asks for responses this
// device will send: as large a message as a requester may post
// (MaxMsgSize), in packets of RespMTU bytes between the least any
// requester uses (minPathMTU) and the device's largest. A request outside
// is NAKed as invalid, as a NIC refuses a malformed request: a READ of
// 4 MiB in 1-byte responses would cost millions of packets.
func (q *qp) readShapeOK(h *wire.Header) bool {
	return h.RespMTU >= minPathMTU && h.RespMTU <= uint32(q.dev.maxMTU) && h.DMALen <= MaxMsgSize
}

// serveBatch is how many packets a READ's responses may add to an outbox
// before it is sent: what one request queues is bounded whatever its
// length (a 1 GiB READ is 4 Mi packets of 256 bytes). A 1 MiB READ across
// an Ethernet path (725 packets) still leaves in one send.
const serveBatch = 1024

// serveRead sends the READ response packets, payload straight from the MR.
func (q *qp) serveRead(c *respCtx, from netip.AddrPort, h *wire.Header, mem []byte, out *outbox) {
	n := readPkts(h.DMALen, h.RespMTU)
	mtu := uint64(h.RespMTU)
	for i := uint32(0); i < n; i++ {
		rh := wire.Header{Op: wire.OpReadResp, PSN: uint32(wire.PSN(h.PSN).Add(i)), Syndrome: wire.SynAck, MSN: c.msn & wire.PSNMask}
		if i == 0 {
			rh.Flags |= wire.FlagFirst
		}
		if i == n-1 {
			rh.Flags |= wire.FlagLast
		}
		lo := uint64(i) * mtu
		hi := min(lo+mtu, uint64(len(mem)))
		if out == &q.dev.rxOut {
			q.dev.rxOutMem = true
		}
		q.stats.TxPackets++
		q.stats.TxBytes += hi - lo
		q.send(from, h.SrcQP, &rh, mem[lo:hi], out)
		if len(out.pkts) >= serveBatch {
			q.dev.flushOutbox(out)
		}
	}
}

// duplicate answers a request whose PSN was already executed.
func (q *qp) duplicate(c *respCtx, from netip.AddrPort, h *wire.Header, out *outbox) {
	psn := wire.PSN(h.PSN)
	switch h.Op {
	case wire.OpReadReq:
		// READ is idempotent: serve it again from current memory.
		mem, why := q.remoteMem(h.RKey, h.VA, uint64(h.DMALen), verbs.AccessRemoteRead)
		if why != verbs.ReasonNone || !q.readShapeOK(h) {
			return
		}
		q.serveRead(c, from, h, mem, out)
	case wire.OpCmpSwap, wire.OpFetchAdd:
		for i := range c.atomics {
			if a := &c.atomics[i]; a.valid && a.psn == psn {
				q.send(from, h.SrcQP, &wire.Header{Op: wire.OpAtomicAck, PSN: uint32(psn), Syndrome: wire.SynAck, MSN: c.msn & wire.PSNMask, Orig: a.orig}, nil, out)
				return
			}
		}
		// Older than the replay cache: the requester has its result.
	default:
		q.ack(c, from, h.SrcQP, out)
	}
}

// ack acknowledges everything before ePSN, coalescing with an ACK of the
// same context still waiting in the receive outbox.
func (q *qp) ack(c *respCtx, to netip.AddrPort, dest uint32, out *outbox) {
	h := wire.Header{Op: wire.OpAck, DestQP: dest, SrcQP: q.qpn, PSN: uint32(c.ePSN.Add(wire.PSNMask)), Syndrome: wire.SynAck, MSN: c.msn & wire.PSNMask}
	d := q.dev
	if out == &d.rxOut && c.ackGen == d.rxGen && c.ackIdx < len(out.pkts) {
		p := &out.pkts[c.ackIdx]
		if p.To == to {
			if out.auth != nil {
				h.Flags |= wire.FlagMAC // signed at flush, like every packet
			}
			h.Append(p.Hdr[:0]) // same length: re-encoded in place
			return
		}
	}
	c.ackIdx, c.ackGen = len(out.pkts), d.rxGen
	out.add(to, &h, nil)
}

func (q *qp) send(to netip.AddrPort, dest uint32, h *wire.Header, payload []byte, out *outbox) {
	h.DestQP, h.SrcQP = dest, q.qpn
	out.add(to, h, payload)
}

func (q *qp) rnrNAK(from netip.AddrPort, h *wire.Header, out *outbox) {
	q.stats.RNRNAKSent++
	t := q.attr.MinRNRTimer / time.Microsecond
	q.send(from, h.SrcQP, &wire.Header{Op: wire.OpAck, PSN: h.PSN, Syndrome: wire.SynRNR, RNRTimer: uint16(min(t, 65535))}, nil, out)
}

// nak sends an error NAK for h without touching responder state.
func (q *qp) nak(from netip.AddrPort, h *wire.Header, syn wire.Syndrome, why verbs.Reason, out *outbox) {
	q.stats.ErrNAKSent++
	q.send(from, h.SrcQP, &wire.Header{Op: wire.OpAck, PSN: h.PSN, Syndrome: syn, Reason: uint8(why)}, nil, out)
}

// nakErr NAKs a request that cannot be executed. On RC the responder QP
// moves to ERR too, as on hardware, and the device raises the event a
// responder error raises there (no completion reports it): an access
// error for a bad rkey, bounds or permission, an invalid request for the
// rest. A DCT stays up (it is shared) and only ends the initiator's
// message.
func (q *qp) nakErr(c *respCtx, from netip.AddrPort, h *wire.Header, syn wire.Syndrome, why verbs.Reason, out *outbox) {
	q.nak(from, h, syn, why, out)
	c.inMsg, c.wmem = false, nil
	if q.typ == verbs.RC && q.state != verbs.StateErr {
		ev := verbs.EventQPReqErr
		if syn == wire.SynNAKAccess {
			ev = verbs.EventQPAccessErr
		}
		q.dev.raise(verbs.Event{Type: ev, QP: q})
		q.toErrLocked()
	}
}

// execAtomic executes CMP_SWAP or FETCH_ADD on 8 bytes of registered
// memory in host byte order. Aligned memory uses CPU atomics, so NIC
// atomics are atomic with local programs' atomics on the same word too;
// memory that is not 8-byte aligned in the host falls back to a device
// lock (atomic among NIC operations only).
func (d *Device) execAtomic(mem []byte, op wire.Opcode, swapAdd, cmp uint64) uint64 {
	p := unsafe.Pointer(&mem[0])
	if uintptr(p)%8 == 0 {
		w := (*uint64)(p)
		if op == wire.OpFetchAdd {
			return atomic.AddUint64(w, swapAdd) - swapAdd
		}
		for {
			old := atomic.LoadUint64(w)
			if old != cmp {
				return old
			}
			if atomic.CompareAndSwapUint64(w, old, swapAdd) {
				return old
			}
		}
	}
	d.atomicMu.Lock()
	defer d.atomicMu.Unlock()
	old := *(*uint64)(p)
	if op == wire.OpFetchAdd {
		*(*uint64)(p) = old + swapAdd
	} else if old == cmp {
		*(*uint64)(p) = swapAdd
	}
	return old
}
