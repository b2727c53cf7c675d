package udplink

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// rxWaitMax bounds a blocking receive (SO_RCVTIMEO): the longest an
// interrupt waits when its kick datagram was lost, at the cost of an idle
// link waking this often, and the longest a driver with a done channel
// waits without looking at it (link.DonePoll).
const rxWaitMax = link.DonePoll

// predState is the memory of the predicted receive path (see "Predicted
// receive" in the package doc); part of rxState, used only by the holder
// of the receive token.
type predState struct {
	msg  unix.Msghdr // name: rxState.from, control: rxState.ctrl, iov: rxState.iov
	pred [maxRxSegs]link.Prediction
	reg  [maxRxSegs]predRegion
	nreg int
}

// predRegion is predicted memory in the datagram's layout: the bytes at
// datagram offset off..off+len(dst) land in dst instead of scratch.
type predRegion struct {
	off  int
	dst  []byte
	used bool // a packet's payload landed here and belongs here
}

func (rx *rxState) initPredict() {
	p := &rx.pr
	p.msg.Name = (*byte)(unsafe.Pointer(&rx.from))
	p.msg.Control = (*byte)(unsafe.Pointer(&rx.ctrl[0]))
	p.msg.Iov = &rx.iov[0]
}

// layout builds the iovec for the first n predictions in rx.pr.pred: the
// datagram is laid out in scratch as on the wire, except that each
// predicted payload's bytes go to its memory. Predictions that do not fit
// the 64 KiB scratch layout are ignored.
func (rx *rxState) layout(n int) {
	p := &rx.pr
	niov, cur, off := 0, 0, 0
	p.nreg = 0
	for i := 0; i < n; i++ {
		pd := &p.pred[i]
		h, m := pd.HdrLen, len(pd.Payload)
		if h < wire.BaseLen || m == 0 || off+h+m > scratchLen {
			break
		}
		setIov(&rx.iov[niov], rx.scratch[cur:off+h])
		setIov(&rx.iov[niov+1], pd.Payload)
		niov += 2
		p.reg[p.nreg] = predRegion{off: off + h, dst: pd.Payload}
		p.nreg++
		off += h + m
		cur = off
	}
	setIov(&rx.iov[niov], rx.scratch[cur:])
	niov++
	p.msg.SetIovlen(niov)
	clear(p.pred[:n]) // do not keep the receiver's memory alive
}

// boundWait sets the socket's receive timeout (SO_RCVTIMEO) to rxWaitMax
// (bounded) or clears it, with a system call only when that changes. A
// kick can be lost (an input firewall may drop the link's datagram to
// itself), so a receive that blocks holding RxLock must be bounded: it
// then lets go after at most rxWaitMax. The timeout is set when such a
// receive starts and cleared only after a receive without RxLock timed
// out, that is after the link has been idle for rxWaitMax: a busy link
// does not switch it back and forth between READs (two system calls per
// READ when the receive goroutine alternates between waiting with and
// without a prediction), and an idle one wakes once, then sleeps.
// rx.waitBounded, like rx, belongs to the token holder.
func (l *Link) boundWait(rx *rxState, holding bool) {
	if rx.waitBounded == holding {
		return
	}
	var tv unix.Timeval
	if holding {
		tv = unix.NsecToTimeval(rxWaitMax.Nanoseconds())
	}
	if err := unix.SetsockoptTimeval(rx.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		l.c.rxErrors.Add(1)
		return
	}
	rx.waitBounded = holding
}

// recvPredicted receives one datagram into the layout built by layout
// and returns its full length (MSG_TRUNC) and GRO segment size.
func (rx *rxState) recvPredicted(flags int) (total, gso int, errno unix.Errno) {
	p := &rx.pr
	p.msg.Namelen = unix.SizeofSockaddrAny
	p.msg.SetControllen(len(rx.ctrl) * 8)
	p.msg.Flags = 0
	n, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(rx.fd),
		uintptr(unsafe.Pointer(&p.msg)), uintptr(unix.MSG_TRUNC|flags))
	if e != 0 {
		return 0, 0, e
	}
	return int(n), groSizeOf(&rx.ctrl, int(p.msg.Controllen)), 0
}

// recvOnePredicted is recvOne for a receiver that implements
// link.Predictor: one recvmsg per datagram, straight into the predicted
// memory. See recvOne for flags and blocked.
func (l *Link) recvOnePredicted(r link.Receiver, pr link.Predictor, rx *rxState, flags int, blocked *atomic.Bool) rxResult {
	r.RxLock()
	locked := true
	block := flags&unix.MSG_DONTWAIT == 0
	if block {
		// Publish that we may block holding RxLock, and that we may block
		// with nothing predicted, before asking for a prediction: a
		// receiver that wants RxLock publishes its request before it
		// looks at predBlocked, and a READ is queued before Send looks at
		// rxIdle, so one side always sees the other.
		l.predBlocked.Store(true)
		l.rxIdle.Store(true)
	}
	n := pr.Predict(rx.pr.pred[:], l, !block)
	if block {
		if n > 0 {
			l.rxIdle.Store(false)
		} else {
			// Nothing to place: wait without RxLock (Send kicks us out
			// for a large READ, see predictKickMin).
			l.predBlocked.Store(false)
			r.RxUnlock()
			locked = false
		}
	}
	if block && (locked || rx.doneWatch) {
		l.boundWait(rx, true)
	}
	rx.layout(n)
	total, gso, errno := rx.recvPredicted(flags)
	if block {
		l.predBlocked.Store(false)
		l.rxIdle.Store(false)
	}
	if blocked != nil {
		blocked.Store(false)
	}
	l.c.rxSyscalls.Add(1)
	res := rxGot
	switch {
	case l.closing.Load():
		res = rxClosing
	case errno == unix.EAGAIN && block:
		// The receive timeout: a kick may have been lost; allow another.
		// A wait without RxLock that timed out found the link idle for
		// rxWaitMax: the next one need not wake.
		l.kickPending.Store(false)
		l.c.rxTimeouts.Add(1)
		if !locked && !rx.doneWatch {
			l.boundWait(rx, false)
		}
		res = rxAgain
	case errno == unix.EINTR:
		if rx.waitBounded {
			l.c.rxInterrupted.Add(1)
		}
		res = rxAgain
	case errno == unix.EAGAIN:
		res = rxAgain
	case errno == unix.EBADF:
		res = rxClosing
	case errno != 0:
		l.c.rxErrors.Add(1)
		res = rxAgain
	case total == 0 && rx.pr.msg.Namelen == 0:
		res = rxClosing // shutdown
	case total == 0 && l.isKick(addrPortFromRaw(&rx.from, rx.pr.msg.Namelen)):
		l.kickPending.Store(false)
		l.c.kicks.Add(1)
		res = rxAgain
	}
	if res != rxGot {
		clear(rx.iov[:2*rx.pr.nreg+1]) // the entries recvPredicted set
		rx.pr.nreg = 0
		if locked {
			r.RxUnlock()
		}
		if errno != 0 && errno != unix.EINTR && errno != unix.EAGAIN && errno != unix.EBADF {
			time.Sleep(time.Millisecond) // do not spin on a persistent error
		}
		return res
	}
	if !locked {
		r.RxLock()
	}
	l.placePredicted(r, rx, total, gso)
	r.RxUnlock()
	return rxGot
}

// placePredicted checks every packet of the datagram just received
// against the predictions, copies payload bytes that landed in predicted
// memory where they do not belong back into scratch (counted), and
// delivers. RxLock is held.
func (l *Link) placePredicted(r link.Receiver, rx *rxState, total, gso int) {
	p := &rx.pr
	from := addrPortFromRaw(&rx.from, p.msg.Namelen)
	seg := total
	if gso > 0 && gso < total {
		seg = gso
	}
	limit := total
	if total > scratchLen {
		limit = scratchLen / seg * seg // whole packets only
	}
	nseg := 0
	if seg > 0 {
		nseg = (limit + seg - 1) / seg
	}
	var mispredicted uint64

	// The first header, from scratch; it may reach into the first region
	// only if the prediction was wrong.
	avail := min(limit, wire.MaxHeaderLen, seg)
	if p.nreg > 0 {
		avail = min(avail, p.reg[0].off)
	}
	h, err := wire.HeaderLen(rx.scratch[:avail])
	steer := p.nreg > 0
	if steer && (err != nil || h > avail) && p.reg[0].off < min(limit, seg) {
		// The first header is not the predicted one: nothing is in place.
		mispredicted += rx.restore(limit)
		avail = min(limit, wire.MaxHeaderLen, seg)
		h, err = wire.HeaderLen(rx.scratch[:avail])
		steer = false
	}
	steer = steer && err == nil && h <= avail

	// Match packets with regions: packet i's payload is predicted if a
	// region starts right after its header, has its payload length, is
	// the memory Steer names for it, and its header has the first
	// header's length.
	if steer {
		first := rx.scratch[:h]
		k := 0
		for i := 0; i < nseg && i < maxRxSegs; i++ {
			off := i * seg
			sl := min(seg, limit-off)
			if sl < h {
				continue
			}
			plen := sl - h
			dst := r.Steer(from, first, i, plen)
			if plen == 0 || len(dst) != plen {
				continue
			}
			for k < p.nreg && p.reg[k].off < off+h {
				k++
			}
			if k == p.nreg {
				continue
			}
			g := &p.reg[k]
			if g.used || g.off != off+h || !samePlace(g.dst, dst) || (k > 0 && p.reg[k-1].off+len(p.reg[k-1].dst) > off) {
				continue
			}
			if hl, err := wire.HeaderLen(rx.scratch[off : off+h]); err != nil || hl != h {
				continue
			}
			g.used = true
			rx.steered[i] = dst
		}
	}
	mispredicted += rx.restore(limit)

	n := rxCounts{mispredicted: mispredicted}
	if total == 0 {
		r.Deliver(from, rx.scratch[:0], nil)
		n.malformed++
	}
	for i := 0; i < nseg; i++ {
		off := i * seg
		b := rx.scratch[off : off+min(seg, limit-off)]
		if i < maxRxSegs && rx.steered[i] != nil {
			r.Deliver(from, b[:h], rx.steered[i])
			n.steered++
			continue
		}
		n.deliver(r, from, b)
	}
	clear(rx.steered[:min(nseg, maxRxSegs)])
	clear(rx.iov[:2*p.nreg+1]) // the entries recvPredicted set
	clear(p.reg[:p.nreg])
	p.nreg = 0
	l.count(total, limit, nseg, &n)
}

// restore copies the bytes the kernel placed in every region not marked
// used back into their place in scratch, so that scratch holds the
// datagram as on the wire, and marks them used. It returns how many
// regions held received bytes (each one a counted copy).
func (rx *rxState) restore(limit int) (copies uint64) {
	p := &rx.pr
	for k := 0; k < p.nreg; k++ {
		g := &p.reg[k]
		if g.used || g.off >= limit {
			continue
		}
		copy(rx.scratch[g.off:min(g.off+len(g.dst), limit)], g.dst)
		g.used = true
		copies++
	}
	return copies
}

// samePlace reports whether a and b are the same memory.
func samePlace(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

var _ link.Interrupter = (*Link)(nil)

// InterruptRecv implements link.Interrupter.
func (l *Link) InterruptRecv() {
	if l.predBlocked.Load() {
		l.kick()
	}
}
