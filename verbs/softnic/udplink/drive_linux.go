package udplink

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

var (
	_ link.Driver   = (*Link)(nil)
	_ link.Lingerer = (*Link)(nil)
)

// Receive-token holders.
const (
	tokFree   = iota
	tokLink   // the link's receive goroutine, receiving without blocking
	tokDriver // a Drive caller
)

// rxToken decides who may receive. See "Run to completion" in the package
// doc.
type rxToken struct {
	mu      sync.Mutex // guards the fields below except nwait
	holder  int
	waiters []*driveWaiter // Drive callers waiting for the token, oldest first
	armed   bool           // the socket is in the receive goroutine's epoll set (never while a driver holds the token)
	nwait   atomic.Int32   // len(waiters), readable without mu

	// Lingering: a driver that leaves the token leaves the socket out of
	// the epoll set, and the receive goroutine's wait gets a deadline; when
	// it passes, the goroutine adds the socket back unless drivers came
	// meanwhile. See "Run to completion" in the package doc.
	drove     bool        // a driver left the token since the receive goroutine last looked
	lingering bool        // the receive goroutine's wait has a deadline
	idle      atomic.Bool // the token is free with the socket out of the set (lingering): StopLinger's fast check
	offUntil  time.Time   // no lingering before then: a request waited for a lapse; zero when lingering is on
}

// lingerFor is how long the socket stays out of the receive goroutine's
// epoll set after drivers stop coming. It bounds the extra wait of a
// datagram that arrives after the last driver left (at most twice this),
// and the receive goroutine wakes at most once per period while drivers
// keep coming.
const lingerFor = 500 * time.Microsecond

// lingerOffFor is how long a link does not linger after a peer's request
// waited for a lapse (a node that also serves requests, which its own
// drivers need not receive).
const lingerOffFor = time.Second

// driveWaiter is a Drive caller waiting for the token.
type driveWaiter struct {
	ch      chan struct{} // cap 1: the token was handed over
	granted bool          // guarded by rxToken.mu
}

var waiterPool = sync.Pool{New: func() any { return &driveWaiter{ch: make(chan struct{}, 1)} }}

// releaseToken passes the token to the oldest waiting driver, or frees it
// (the receive goroutine's epoll reports whatever arrives from now on, or,
// if a driver lingers, once the linger ends).
func (l *Link) releaseToken() {
	t := &l.tok
	t.mu.Lock()
	l.releaseLocked()
}

// releaseLocked is releaseToken with tok.mu held; it unlocks it.
func (l *Link) releaseLocked() {
	t := &l.tok
	if len(t.waiters) > 0 {
		w := t.waiters[0]
		copy(t.waiters, t.waiters[1:])
		t.waiters[len(t.waiters)-1] = nil
		t.waiters = t.waiters[:len(t.waiters)-1]
		t.nwait.Add(-1)
		// A driver holds the token with the socket out of the receive
		// goroutine's epoll set (it is in it when the goroutine hands
		// over), so that no arrival wakes the goroutine for nothing; the
		// set reports what the driver did not receive when the socket is
		// added back (at its release, or when a linger ends).
		l.armLocked(false)
		t.holder = tokDriver
		w.granted = true
		t.mu.Unlock()
		w.ch <- struct{}{}
		return
	}
	if t.holder == tokDriver {
		// Linger: leave the socket out of the epoll set, so that a driver
		// that comes back soon (a synchronous caller's next operation)
		// takes the token without a system call. The receive goroutine
		// adds the socket back once drivers have stopped coming for
		// lingerFor, which reports whatever arrived meanwhile.
		// The clock is read only while lingering is off after a miss
		// (rare), not on every release.
		if !t.offUntil.IsZero() && !time.Now().Before(t.offUntil) {
			t.offUntil = time.Time{}
		}
		q, ok := l.r.(link.Quiescer)
		if !t.offUntil.IsZero() || (ok && !q.Quiet()) {
			// Not lingering: for now (see lingerLapsed), or while
			// operations are outstanding that someone may wait for
			// without driving.
			l.armLocked(true)
		} else {
			t.idle.Store(true)
			t.drove = true
			if !t.lingering && l.epFile != nil {
				t.lingering = true
				_ = l.epFile.SetReadDeadline(time.Now().Add(l.linger))
			}
		}
	}
	t.holder = tokFree
	t.mu.Unlock()
}

// StopLinger implements link.Lingerer.
func (l *Link) StopLinger() {
	t := &l.tok
	if !t.idle.Load() {
		return
	}
	t.mu.Lock()
	if t.holder == tokFree && !t.armed && l.epfd >= 0 {
		l.armLocked(true) // reports data already queued
		l.c.lingerStops.Add(1)
	}
	t.mu.Unlock()
}

// lingerLapsed is the receive goroutine's check when its wait's deadline
// passed: it adds the socket back to the epoll set if no driver came for
// a whole period, or waits another period.
func (l *Link) lingerLapsed() {
	t := &l.tok
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holder == tokFree {
		stuck := !t.armed && l.requestQueued()
		if stuck || !t.drove {
			if stuck {
				// A request arrived after the last driver left and
				// waited for this lapse: this link serves peers, whose
				// requests its own drivers need not receive, so it stops
				// lingering for a while.
				t.offUntil = time.Now().Add(lingerOffFor)
				l.c.lingerMisses.Add(1)
			}
			if !t.armed {
				l.armLocked(true) // reports data already queued: the next wait returns at once
				l.c.lingerRearms.Add(1)
			}
			t.lingering, t.drove = false, false
			_ = l.epFile.SetReadDeadline(time.Time{})
			return
		}
	}
	t.drove = false
	_ = l.epFile.SetReadDeadline(time.Now().Add(l.linger))
}

// armLocked adds the socket to (on) or removes it from the receive
// goroutine's epoll set. Adding it reports data already queued. While a
// driver holds the token, arrivals would only wake the receive goroutine
// for nothing (the driver receives them), so the socket is removed.
//
// Removed, not modified to an empty interest: an epoll entry stays on the
// socket's wait queue, and every datagram the socket receives, and every
// one it sends (when the kernel frees it, sock_wfree), then walks that
// queue with interrupts off — about 1 us per READ round trip on this VM's
// loopback, which a plain ping-pong never pays. Arming is rare (a driver
// lingers on the token), so the add's extra cost does not show.
func (l *Link) armLocked(on bool) {
	t := &l.tok
	if t.armed == on || l.epfd < 0 {
		return
	}
	op, ev := unix.EPOLL_CTL_DEL, unix.EpollEvent{Fd: int32(l.fd)}
	if on {
		op, ev.Events = unix.EPOLL_CTL_ADD, unix.EPOLLIN|unix.EPOLLRDHUP|(unix.EPOLLET&0xffffffff)
	}
	if err := unix.EpollCtl(l.epfd, op, l.fd, &ev); err != nil {
		l.c.rxErrors.Add(1)
		return
	}
	t.armed = on
	if on {
		t.idle.Store(false)
	}
	l.c.epollMoves.Add(1)
}

// Drive implements link.Driver.
func (l *Link) Drive(done, wake <-chan struct{}, ready func() bool) error {
	t := &l.tok
	for {
		if ready() {
			return nil
		}
		if l.closing.Load() {
			return ErrClosed
		}
		t.mu.Lock()
		if t.holder == tokFree {
			t.holder = tokDriver
			l.armLocked(false)
			t.mu.Unlock()
			return l.hold(done, ready)
		}
		w := waiterPool.Get().(*driveWaiter)
		t.waiters = append(t.waiters, w)
		t.nwait.Add(1)
		t.mu.Unlock()
		if l.bgInRecv.Load() {
			l.kick() // the receive goroutine blocks in recvmsg: make it hand over
		}
		// Look again now that a release will see us: whatever made ready
		// true before this point is seen here, anything later wakes us.
		if !ready() {
			select {
			case <-w.ch:
			case <-wake:
			case <-done:
			}
		}
		t.mu.Lock()
		granted := w.granted
		if !granted {
			for i, x := range t.waiters {
				if x == w {
					t.waiters = append(t.waiters[:i], t.waiters[i+1:]...)
					t.nwait.Add(-1)
					break
				}
			}
		}
		t.mu.Unlock()
		if granted {
			select {
			case <-w.ch: // consume the hand-over if the select above did not
			default:
			}
		}
		w.granted = false
		waiterPool.Put(w)
		if granted {
			return l.hold(done, ready)
		}
		select {
		case <-done:
			if !ready() {
				return link.ErrDone
			}
			return nil
		default:
		}
	}
}

// hold receives on the caller's goroutine while it holds the token, until
// ready, done or Close; then it passes the token on.
func (l *Link) hold(done <-chan struct{}, ready func() bool) error {
	if !l.fdMu.TryRLock() {
		l.releaseToken()
		return ErrClosed // Close is waiting for the descriptor
	}
	l.driveSeq.Add(1)
	err := l.holdLocked(done, ready)
	l.releaseDriver()
	l.fdMu.RUnlock()
	return err
}

func (l *Link) holdLocked(done <-chan struct{}, ready func() bool) error {
	if l.fd < 0 || l.closing.Load() {
		return ErrClosed
	}
	rx := l.rx
	// With a done channel, every wait is bounded (link.DonePoll), so that
	// done is looked at even if nobody calls Wake for it.
	rx.doneWatch = done != nil
	defer func() { rx.doneWatch = false }()
	for {
		gen := l.wakeGen.Load()
		if ready() {
			return nil
		}
		if done != nil {
			select {
			case <-done:
				return link.ErrDone
			default:
			}
		}
		// Publish that we are about to block, then check that nobody
		// called Wake since ready ran: a Wake before the store is seen by
		// the check, a Wake after it sees inRecv and kicks.
		l.inRecv.Store(true)
		if l.wakeGen.Load() != gen {
			l.inRecv.Store(false)
			continue
		}
		res := l.recvOne(l.r, rx, 0, &l.inRecv)
		l.inRecv.Store(false)
		if res == rxClosing {
			return ErrClosed
		}
	}
}

// releaseDriver gives the token up after a Drive.
func (l *Link) releaseDriver() { l.releaseToken() }

// Wake implements link.Driver.
func (l *Link) Wake() {
	l.wakeGen.Add(1)
	if l.inRecv.Load() {
		l.kick()
	}
}

// kick sends the link an empty datagram, which makes whoever blocks in
// recvmsg return (and is then dropped). One is in flight at a time.
func (l *Link) kick() {
	if !l.kickPending.CompareAndSwap(false, true) {
		return
	}
	if !l.fdMu.TryRLock() {
		return // closing: shutdown wakes every receiver
	}
	defer l.fdMu.RUnlock()
	if l.fd < 0 {
		return
	}
	var sa unix.RawSockaddrInet6
	n := putSockaddr(&sa, l.kickAddr, l.v6)
	var msg unix.Msghdr
	msg.Name = (*byte)(unsafe.Pointer(&sa))
	msg.Namelen = n
	for {
		_, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(l.fd), uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT)
		if e != unix.EINTR {
			if e != 0 {
				// A full buffer holds datagrams the receiver will wake
				// for anyway; anything else is counted.
				l.kickPending.Store(false)
				if e != unix.EAGAIN && e != unix.ENOBUFS {
					l.c.txErrors.Add(1)
				}
			}
			return
		}
	}
}

// isKick reports whether an empty datagram from from is this link's own
// Wake.
func (l *Link) isKick(from netip.AddrPort) bool {
	return from.Port() == l.local.Port() && (from.Addr() == l.kickAddr.Addr().Unmap() || from.Addr() == l.local.Addr())
}

// requestQueued reports whether the datagram at the head of the socket's
// queue is one a peer waits on: a request, a connection-management
// message or a handshake. A late response or acknowledgment (a duplicate,
// or one for an operation already completed) is not: nobody waits on it.
func (l *Link) requestQueued() bool {
	var b [wire.MaxHeaderLen]byte
	n, _, err := unix.Recvfrom(l.fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err != nil || n <= 0 {
		return false
	}
	h, _, err := wire.Parse(b[:min(n, len(b))])
	return err == nil && (h.Op.IsRequest() || h.Op.IsCM() || h.Op.IsHandshake())
}
