package udplink

import (
	"errors"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

const (
	// scratchLen holds any UDP datagram (at most 65527 bytes) and GRO
	// batches up to the default 64 KiB GRO limit.
	scratchLen = 1 << 16
	// maxRxSegs bounds the packets of one GRO batch that can be steered:
	// the kernel coalesces at most 64 (UDP_GRO_CNT_MAX) and a GSO sender
	// sends at most 128 (UDP_MAX_SEGMENTS). Packets beyond it go to scratch
	// without a Steer call.
	maxRxSegs = 128
)

// rxState is the receive goroutine's memory: one heap object, allocated
// by Start, that every msghdr and iovec points into, so it lives as long
// as any system call that uses it. Only the receive goroutine touches it.
type rxState struct {
	fd int

	peekBuf [wire.MaxHeaderLen]byte
	ctrl    [8]uint64 // control messages of the peek; uint64 for cmsghdr alignment
	from    unix.RawSockaddrAny
	peekIov unix.Iovec
	peekMsg unix.Msghdr // MSG_PEEK: peekBuf, from, ctrl

	msg     unix.Msghdr // the real receive: iov, no name, no control
	iov     [2*maxRxSegs + 1]unix.Iovec
	steered [maxRxSegs][]byte // Steer's result per packet of the current datagram; nil when none

	pr          predState // the predicted receive path's (predict_linux.go)
	waitBounded bool      // SO_RCVTIMEO is set (boundWait)
	doneWatch   bool      // the holder is a driver with a done channel: every blocking wait is bounded (link.DonePoll)

	scratch [scratchLen]byte // the datagram, laid out as on the wire, minus steered payloads
}

func newRxState(fd int) *rxState {
	rx := &rxState{fd: fd}
	setIov(&rx.peekIov, rx.peekBuf[:])
	rx.peekMsg.Name = (*byte)(unsafe.Pointer(&rx.from))
	rx.peekMsg.Iov = &rx.peekIov
	rx.peekMsg.SetIovlen(1)
	rx.peekMsg.Control = (*byte)(unsafe.Pointer(&rx.ctrl[0]))
	rx.msg.Iov = &rx.iov[0]
	rx.initPredict()
	return rx
}

// rxResult is what one receive attempt did.
type rxResult int

const (
	rxGot     rxResult = iota // a datagram was delivered (or counted and dropped)
	rxAgain                   // nothing to receive (MSG_DONTWAIT), EINTR, a kick, or a transient error
	rxClosing                 // the link is closing
)

// recvOne receives and delivers one datagram. flags is 0 (block) or
// MSG_DONTWAIT. The caller holds the receive token. blocked, if not nil,
// is the flag that says the caller is blocked in recvmsg; it is cleared as
// soon as the wait is over, before anything is delivered (deliveries may
// call Wake, which must not kick a receiver that is awake).
func (l *Link) recvOne(r link.Receiver, rx *rxState, flags int, blocked *atomic.Bool) rxResult {
	if l.pred != nil {
		return l.recvOnePredicted(r, l.pred, rx, flags, blocked)
	}
	if flags == 0 && rx.doneWatch {
		l.boundWait(rx, true)
	}
	total, gso, errno := rx.peek(flags)
	if blocked != nil {
		blocked.Store(false)
	}
	l.c.rxSyscalls.Add(1)
	if l.closing.Load() {
		return rxClosing
	}
	switch errno {
	case 0:
	case unix.EINTR, unix.EAGAIN:
		if errno == unix.EAGAIN && flags == 0 {
			l.kickPending.Store(false) // the receive timeout: a kick may have been lost
			l.c.rxTimeouts.Add(1)
			if !rx.doneWatch {
				l.boundWait(rx, false) // idle for rxWaitMax: the next wait need not wake
			}
		}
		return rxAgain
	case unix.EBADF:
		return rxClosing // cannot happen while Close waits for us; do not spin
	default:
		// Unexpected (ENOMEM, a stray socket error): count it, and do
		// not spin on it if it persists.
		l.c.rxErrors.Add(1)
		time.Sleep(time.Millisecond)
		return rxAgain
	}
	if total == 0 {
		if rx.peekMsg.Namelen == 0 {
			// shutdown: recvmsg returns 0 without a source address (an
			// empty datagram has one).
			return rxClosing
		}
		if l.isKick(addrPortFromRaw(&rx.from, rx.peekMsg.Namelen)) {
			rx.consume(0)
			l.c.rxSyscalls.Add(1)
			l.kickPending.Store(false)
			l.c.kicks.Add(1)
			return rxAgain
		}
	}
	l.receive(r, rx, total, gso)
	return rxGot
}

// rxLoop is the link's receive goroutine; see "Run to completion" in the
// package doc. It has two modes. Blocking: it holds the receive token and
// blocks in recvmsg, as a plain receiver would (a Drive caller that wants
// the token kicks it out). Event: it leaves receiving to Drive callers and
// waits for data with an edge-triggered epoll, which does not take the
// datagram; it receives only what arrives while nobody holds the token.
// It switches to event mode when a driver appears and back to blocking
// after receiving unassisted several times in a row.
func (l *Link) rxLoop(r link.Receiver, rx *rxState) {
	defer close(l.rxDone)
	t := &l.tok
	blocking := true
	unassisted := 0
	lastDrive := l.driveSeq.Load()
	for !l.closing.Load() {
		if blocking {
			t.mu.Lock()
			if t.holder != tokFree {
				t.mu.Unlock()
				blocking = false
				continue
			}
			t.holder = tokLink
			// Out of the epoll set while blocking in recvmsg: the set is
			// in Go's poller, and every datagram that reached it would
			// wake a poller thread for nothing (a responder's READ paid
			// that: 30-35 us became 35-55 us across a veth).
			l.armLocked(false)
			t.mu.Unlock()
			// Publish that we block, then look for drivers: a driver
			// registered before the store is seen here, one after it
			// sees bgInRecv and kicks.
			l.bgInRecv.Store(true)
			res := rxAgain
			if t.nwait.Load() == 0 {
				res = l.recvOne(r, rx, 0, &l.bgInRecv)
			}
			l.bgInRecv.Store(false)
			if t.nwait.Load() > 0 {
				blocking = false
				unassisted = 0
			}
			t.mu.Lock()
			if !blocking && len(t.waiters) == 0 {
				// Event mode with nobody to hand the token to (the
				// waiter left): the set must report what arrives.
				l.armLocked(true)
			}
			l.releaseLocked()
			if res == rxClosing {
				return
			}
			continue
		}
		// Wait in Go's network poller, which holds no P while it waits:
		// a goroutine blocked in epoll_wait would hold one, and with
		// every P in a system call the runtime hands a blocked driver's P
		// to a new thread (sysmon's retake), which costs the driver a
		// thread switch when its recvmsg returns.
		var ev [1]unix.EpollEvent
		var err error
		rerr := l.epWait.Read(func(fd uintptr) bool {
			for {
				var n int
				n, err = unix.EpollWait(int(fd), ev[:], 0)
				l.c.rxSyscalls.Add(1)
				if err == unix.EINTR {
					continue
				}
				return n > 0 || err != nil || l.closing.Load()
			}
		})
		if l.closing.Load() {
			return
		}
		if errors.Is(rerr, os.ErrDeadlineExceeded) {
			l.lingerLapsed()
			continue
		}
		if rerr != nil || err != nil {
			// Cannot happen (Open checked that the poller took the
			// descriptor); count it and do not spin.
			l.c.rxErrors.Add(1)
			time.Sleep(time.Millisecond)
			continue
		}
		t.mu.Lock()
		if t.holder != tokFree {
			// A driver took the token meanwhile and receives it; once
			// drivers stop coming, re-adding the socket reports what is
			// left (lingerLapsed).
			t.mu.Unlock()
			continue
		}
		t.holder = tokLink
		t.mu.Unlock()
		got, res := 0, rxGot
		for got < 64 && t.nwait.Load() == 0 {
			if res = l.recvOne(r, rx, unix.MSG_DONTWAIT, nil); res != rxGot {
				break
			}
			got++
		}
		l.releaseToken()
		if res == rxClosing {
			return
		}
		if seq := l.driveSeq.Load(); seq != lastDrive {
			lastDrive, unassisted = seq, 0
		} else if got > 0 {
			unassisted++
			blocking = unassisted >= bgBlockAfter
		}
	}
}

// bgBlockAfter is how many receives in a row the receive goroutine makes
// with no driver in between before it goes back to blocking in recvmsg.
const bgBlockAfter = 8

// peek reads the head of the next datagram without consuming it and
// returns its total length and its GRO segment size (0 if not a batch).
func (rx *rxState) peek(flags int) (total, gso int, errno unix.Errno) {
	rx.peekMsg.Namelen = unix.SizeofSockaddrAny
	rx.peekMsg.SetControllen(len(rx.ctrl) * 8)
	rx.peekMsg.Flags = 0
	n, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(rx.fd),
		uintptr(unsafe.Pointer(&rx.peekMsg)), uintptr(unix.MSG_PEEK|unix.MSG_TRUNC|flags))
	if e != 0 {
		return 0, 0, e
	}
	return int(n), rx.groSize(), 0
}

// groSize finds the UDP_GRO control message of the last peek.
func (rx *rxState) groSize() int { return groSizeOf(&rx.ctrl, int(rx.peekMsg.Controllen)) }

// groSizeOf finds the UDP_GRO control message in the first n bytes of
// ctrl (0 if there is none).
func groSizeOf(ctrl *[8]uint64, n int) int {
	b := unsafe.Slice((*byte)(unsafe.Pointer(&ctrl[0])), len(ctrl)*8)
	b = b[:min(n, len(b))]
	for len(b) >= cmsgDataOff {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		n := int(h.Len)
		if n < cmsgDataOff || n > len(b) {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && n >= cmsgLenInt32 {
			return int(*(*int32)(unsafe.Pointer(&b[cmsgDataOff])))
		}
		b = b[min(unix.CmsgSpace(n-cmsgDataOff), len(b)):]
	}
	return 0
}

// consume receives the peeked datagram into the first niov entries of
// rx.iov and returns the bytes received (a datagram larger than the
// iovec is cut short).
func (rx *rxState) consume(niov int) (n int, errno unix.Errno) {
	if niov == 0 {
		rx.msg.Iov = nil
	} else {
		rx.msg.Iov = &rx.iov[0]
	}
	rx.msg.SetIovlen(niov)
	for {
		rx.msg.Flags = 0
		r1, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(rx.fd), uintptr(unsafe.Pointer(&rx.msg)), 0)
		if e == unix.EINTR {
			continue
		}
		return int(r1), e
	}
}

// receive steers, receives and delivers the datagram at the head of the
// queue: total bytes, GRO segment size gso (0: a single packet).
func (l *Link) receive(r link.Receiver, rx *rxState, total, gso int) {
	from := addrPortFromRaw(&rx.from, rx.peekMsg.Namelen)
	seg := total // bytes per packet
	if gso > 0 && gso < total {
		seg = gso
	}
	limit := total // bytes this link will take
	if total > scratchLen {
		limit = scratchLen / seg * seg // whole packets only
	}
	nseg := 0
	if seg > 0 {
		nseg = (limit + seg - 1) / seg
	}

	// Predict every packet's header length from the first header.
	first := rx.peekBuf[:min(total, len(rx.peekBuf), seg)]
	h, err := wire.HeaderLen(first)
	predict := err == nil && h <= seg

	r.RxLock()
	niov, cur := 0, 0 // cur: scratch offset not yet covered by an iovec
	if predict {
		hdr := first[:h]
		for i := 0; i < nseg && i < maxRxSegs; i++ {
			off := i * seg
			sl := min(seg, limit-off)
			if sl < h {
				continue // a short last packet; delivered malformed
			}
			plen := sl - h
			dst := r.Steer(from, hdr, i, plen)
			if plen == 0 || len(dst) != plen {
				continue
			}
			setIov(&rx.iov[niov], rx.scratch[cur:off+h])
			setIov(&rx.iov[niov+1], dst)
			niov += 2
			rx.steered[i] = dst
			cur = off + sl
		}
	}
	if cur < limit {
		setIov(&rx.iov[niov], rx.scratch[cur:limit])
		niov++
	}

	nsteer := min(nseg, maxRxSegs) // entries of rx.steered to clear
	got, errno := rx.consume(niov)
	l.c.rxSyscalls.Add(1)
	if errno != 0 || got != limit {
		// Cannot happen for a datagram the peek saw (the peek already
		// verified its checksum); deliver nothing rather than a guess.
		l.c.rxErrors.Add(1)
		clear(rx.steered[:nsteer])
		clear(rx.iov[:niov])
		r.RxUnlock()
		return
	}

	var n rxCounts
	if total == 0 {
		// An empty datagram is malformed too.
		r.Deliver(from, rx.scratch[:0], nil)
		n.malformed++
	}
	for i := 0; i < nseg; i++ {
		off := i * seg
		b := rx.scratch[off : off+min(seg, limit-off)]
		if i < maxRxSegs && rx.steered[i] != nil {
			dst := rx.steered[i]
			if hl, err := wire.HeaderLen(b[:h]); err == nil && hl == h {
				r.Deliver(from, b[:h], dst)
				n.steered++
				continue
			}
			// Mispredicted: put the packet back together in scratch.
			copy(b[h:], dst)
			n.reassembled++
		}
		n.deliver(r, from, b)
	}
	clear(rx.steered[:nsteer])
	clear(rx.iov[:niov])
	r.RxUnlock()
	l.count(total, limit, nseg, &n)
}

// rxCounts are what one datagram's delivery adds to the counters.
type rxCounts struct {
	steered, reassembled, mispredicted, malformed, probes uint64
}

// deliver delivers packet b, which is in scratch as on the wire: split
// at its header, or whole (counted as a probe or malformed) if the header
// does not parse.
func (n *rxCounts) deliver(r link.Receiver, from netip.AddrPort, b []byte) {
	hl, err := wire.HeaderLen(b)
	if err != nil || hl > len(b) {
		r.Deliver(from, b, nil)
		if link.IsProbe(b) {
			n.probes++
		} else {
			n.malformed++
		}
		return
	}
	r.Deliver(from, b[:hl], b[hl:])
}

// count adds one received datagram to the counters: total bytes on the
// wire, limit of them taken, nseg packets.
func (l *Link) count(total, limit, nseg int, n *rxCounts) {
	if limit < total {
		l.c.truncated.Add(1)
	}
	if nseg > 1 {
		l.c.rxBatches.Add(1)
	}
	if total == 0 {
		nseg = 1
	}
	l.c.rxDatagrams.Add(uint64(nseg))
	l.c.rxBytes.Add(uint64(limit))
	for _, c := range [...]struct {
		v uint64
		c *atomic.Uint64
	}{{n.steered, &l.c.rxSteered}, {n.reassembled, &l.c.rxReassembled}, {n.mispredicted, &l.c.rxMispredicted},
		{n.malformed, &l.c.rxMalformed}, {n.probes, &l.c.rxProbes}} {
		if c.v != 0 {
			c.c.Add(c.v)
		}
	}
}
