package udplink

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
)

var _ link.Link = (*Link)(nil)

// Link is a softnic link over one UDP socket. See the package doc.
type Link struct {
	// Set by Open, read-only afterwards.
	local       netip.AddrPort
	v6          bool // the socket is AF_INET6
	maxDatagram int
	rcvBuf      int
	sndBuf      int
	gro         bool
	groErr      error

	// fdMu guards fd against Close: every Send read-holds it for its whole
	// duration; Close write-holds it to set fd to -1 and close the socket.
	// The receive goroutine uses its own copy of fd and is waited for
	// before fdMu is taken.
	fdMu sync.RWMutex
	fd   int

	// mu guards the Start/Close state.
	mu      sync.Mutex
	started bool
	closed  bool
	rxDone  chan struct{} // closed when the receive goroutine exits; nil until Start

	closeOnce sync.Once
	closeErr  error
	closing   atomic.Bool // set first thing in Close; read by the receive goroutine

	// GSO state shared by concurrent senders.
	gsoMax    atomic.Int64 // largest packet length sent with GSO; 0: GSO off
	gsoWorked atomic.Bool  // a GSO message has been accepted by the kernel

	pmtu pmtuCache

	// Receiving (see drive_linux.go). r and rx are set by Start; rx is used
	// only by the holder of the receive token.
	r           link.Receiver
	pred        link.Predictor // r, if it predicts (then no datagram is peeked)
	predBlocked atomic.Bool    // the receiver is (about to be) blocked in recvmsg holding r's RxLock
	rxIdle      atomic.Bool    // the receiver is blocked in recvmsg with nothing predicted
	rx          *rxState
	tok         rxToken
	kickAddr    netip.AddrPort
	inRecv      atomic.Bool   // a driver is (about to be) blocked in recvmsg
	kickPending atomic.Bool   // a Wake datagram is on its way
	wakeGen     atomic.Uint64 // bumped by every Wake
	bgInRecv    atomic.Bool   // the receive goroutine is (about to be) blocked in recvmsg
	driveSeq    atomic.Uint64 // bumped by every Drive that took the token
	epfd        int           // edge-triggered epoll on fd for the receive goroutine's event mode
	epFile      *os.File      // epfd, registered with Go's network poller (owns epfd)
	epWait      syscall.RawConn
	linger      time.Duration           // lingerFor; tests change it before Start
	txCached    atomic.Pointer[txState] // a free txState kept for the next Send (see Send)

	c counters
}

// counters are the link's atomics; tx and rx are on separate cache lines
// because different goroutines update them.
type counters struct {
	txDatagrams, txBytes, txSyscalls, txErrors atomic.Uint64
	txGSOMessages, txDrops, gsoFallbacks       atomic.Uint64
	_                                          [64]byte
	rxDatagrams, rxBytes, rxSyscalls, rxErrors atomic.Uint64
	truncated, rxBatches, rxSteered            atomic.Uint64
	rxReassembled, rxMalformed, rxMispredicted atomic.Uint64
	rxProbes, rxInterrupted                    atomic.Uint64
	_                                          [64]byte
	pmtuProbes, tooBig, kicks, rxTimeouts      atomic.Uint64
	epollMoves, lingerRearms, lingerMisses     atomic.Uint64
	lingerStops                                atomic.Uint64
}

// Open creates the socket, binds it to cfg.Addr and configures offloads.
// Delivery begins with Start.
func Open(cfg Config) (*Link, error) {
	ap, err := parseAddr(cfg.Addr)
	if err != nil {
		return nil, err
	}
	l := &Link{fd: -1}
	l.epfd = -1
	l.linger = lingerFor
	l.pmtu.probeFd = -1
	family := unix.AF_INET
	if ap.Addr().Is6() {
		family = unix.AF_INET6
		l.v6 = true
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("udplink: socket for %s: %w", ap, err)
	}
	if err := l.setup(fd, ap, cfg); err != nil {
		unix.Close(fd)
		if l.pmtu.probeFd >= 0 {
			unix.Close(l.pmtu.probeFd)
		}
		l.closeEpoll()
		return nil, err
	}
	l.fd = fd
	return l, nil
}

// setup configures and binds fd and fills in l's read-only fields.
func (l *Link) setup(fd int, ap netip.AddrPort, cfg Config) error {
	if l.v6 && ap.Addr().IsUnspecified() {
		// Dual stack regardless of net.ipv6.bindv6only.
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return fmt.Errorf("udplink: IPV6_V6ONLY on %s: %w", ap, err)
		}
	}
	buf := cfg.SocketBuf
	if buf == 0 {
		buf = DefaultSocketBuf
	}
	if buf > 0 {
		setBuf(fd, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, buf)
		setBuf(fd, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, buf)
	}
	l.rcvBuf, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	l.sndBuf, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF)

	var sa unix.Sockaddr
	if l.v6 {
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	} else {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("udplink: bind %s: %w", ap, err)
	}
	bound, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("udplink: getsockname after binding %s: %w", ap, err)
	}
	switch sa := bound.(type) {
	case *unix.SockaddrInet4:
		l.local = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		l.local = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	l.maxDatagram = maxDatagramFor(ap.Addr())
	l.kickAddr = link.SelfAddr(l.local)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("udplink: epoll for %s: %w", ap, err)
	}
	l.epfd = ep
	if err := unix.SetNonblock(ep, true); err != nil {
		return fmt.Errorf("udplink: epoll for %s: %w", ap, err)
	}
	l.epFile = os.NewFile(uintptr(ep), "udplink-epoll")
	rc, err := l.epFile.SyscallConn()
	if err != nil {
		return fmt.Errorf("udplink: epoll for %s: %w", ap, err)
	}
	l.epWait = rc
	// The receive goroutine's waits rely on the poller (and its
	// deadlines): refuse a descriptor it did not take.
	if err := l.epFile.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("udplink: epoll for %s: not pollable: %w", ap, err)
	}
	l.tok.armed = true
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | (unix.EPOLLET & 0xffffffff), Fd: int32(fd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("udplink: epoll for %s: %w", ap, err)
	}
	if err := l.setupPMTU(fd); err != nil {
		return fmt.Errorf("udplink: path MTU discovery on %s: %w", ap, err)
	}

	if cfg.GSO {
		// UDP_SEGMENT is readable on every kernel that implements it.
		if _, err := unix.GetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT); err == nil {
			l.gsoMax.Store(int64(l.maxDatagram))
		}
	}
	if cfg.GRO {
		if err := unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1); err != nil {
			l.groErr = fmt.Errorf("udplink: enabling UDP_GRO: %w", err)
		} else {
			l.gro = true
		}
	}
	return nil
}

// setBuf sets a socket buffer size, past the sysctl limit if permitted.
// Failure is not fatal: the kernel default still works, only slower.
func setBuf(fd, force, plain, size int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, plain, size)
	}
}

// parseAddr parses a numeric IP:port; an IPv4-mapped IPv6 address binds an
// IPv4 socket.
func parseAddr(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return ap, fmt.Errorf("%w %q: %w", ErrBadAddress, s, err)
	}
	if ap.Addr().Zone() != "" {
		return ap, fmt.Errorf("%w %q: IPv6 zones are not supported", ErrBadAddress, s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// maxDatagramFor is the largest datagram a socket bound to a can send to
// every peer it can reach: a dual-stack IPv6 socket (bound to "::") may
// talk to IPv4 peers, so it gets the IPv4 limit.
func maxDatagramFor(a netip.Addr) int {
	if a.Is6() && !a.IsUnspecified() {
		return MaxDatagramIPv6
	}
	return MaxDatagramIPv4
}

// LocalAddr is the bound address (with the port the kernel chose).
func (l *Link) LocalAddr() netip.AddrPort { return l.local }

// MaxDatagram is the largest datagram Send can carry: 65507 bytes for IPv4
// and dual-stack links, 65527 for IPv6-only links.
func (l *Link) MaxDatagram() int { return l.maxDatagram }

// Start begins delivering to r on the link's receive goroutine. It panics
// if called twice; after Close it does nothing.
func (l *Link) Start(r link.Receiver) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		panic("udplink: Start called twice")
	}
	l.started = true
	if l.closed {
		return
	}
	l.rxDone = make(chan struct{})
	l.r = r
	l.pred, _ = r.(link.Predictor)
	l.rx = newRxState(l.fd)
	go l.rxLoop(r, l.rx)
}

// Close stops delivery, waits for the receive goroutine and for running
// Sends, and closes the socket. It must not be called from the Receiver's
// callbacks. Later calls return nil.
func (l *Link) Close() error {
	first := false
	l.closeOnce.Do(func() {
		first = true
		l.closeErr = l.close()
	})
	if !first {
		return nil
	}
	return l.closeErr
}

func (l *Link) close() error {
	l.mu.Lock()
	l.closed = true
	done := l.rxDone
	l.mu.Unlock()

	l.closing.Store(true)
	// ENOTCONN is expected on an unconnected socket; the flags are set and
	// the waiters woken anyway (see "Closing" in the package doc). No other
	// error is possible on a valid UDP socket; report one if it happens.
	var errs []error
	if err := unix.Shutdown(l.fd, unix.SHUT_RDWR); err != nil && err != unix.ENOTCONN {
		errs = append(errs, fmt.Errorf("udplink: shutdown %s: %w", l.local, err))
	}
	// A receive goroutine waiting with the socket out of its epoll set
	// (lingering) is not woken by the shutdown: end its wait.
	l.tok.mu.Lock()
	if l.epFile != nil {
		_ = l.epFile.SetReadDeadline(time.Unix(1, 0))
	}
	l.tok.mu.Unlock()
	if done != nil {
		<-done
	}
	l.fdMu.Lock()
	fd := l.fd
	l.fd = -1
	l.fdMu.Unlock()
	if err := unix.Close(fd); err != nil {
		errs = append(errs, fmt.Errorf("udplink: close %s: %w", l.local, err))
	}
	l.closeEpoll()
	l.pmtu.mu.Lock()
	if l.pmtu.probeFd >= 0 {
		unix.Close(l.pmtu.probeFd)
		l.pmtu.probeFd = -1
	}
	l.pmtu.mu.Unlock()
	return errors.Join(errs...)
}

// Stats reports the link.Stats counters.
func (l *Link) Stats() link.Stats {
	c := &l.c
	return link.Stats{
		TxDatagrams: c.txDatagrams.Load(),
		RxDatagrams: c.rxDatagrams.Load(),
		TxBytes:     c.txBytes.Load(),
		RxBytes:     c.rxBytes.Load(),
		TxSyscalls:  c.txSyscalls.Load(),
		RxSyscalls:  c.rxSyscalls.Load(),
		TxErrors:    c.txErrors.Load(),
		RxErrors:    c.rxErrors.Load(),
		TxDrops:     c.txDrops.Load(),
		Truncated:   c.truncated.Load(),
		RxCopies:    c.rxMispredicted.Load(),
	}
}

// Counters reports every counter and the offload state.
func (l *Link) Counters() Counters {
	c := &l.c
	gsoMax := int(l.gsoMax.Load())
	return Counters{
		Stats:          l.Stats(),
		RxBatches:      c.rxBatches.Load(),
		RxSteered:      c.rxSteered.Load(),
		RxReassembled:  c.rxReassembled.Load(),
		RxMispredicted: c.rxMispredicted.Load(),
		RxMalformed:    c.rxMalformed.Load(),
		RxProbes:       c.rxProbes.Load(),
		PMTUProbes:     c.pmtuProbes.Load(),
		TooBig:         c.tooBig.Load(),
		Kicks:          c.kicks.Load(),
		RxTimeouts:     c.rxTimeouts.Load(),
		EpollMoves:     c.epollMoves.Load(),
		LingerRearms:   c.lingerRearms.Load(),
		LingerMisses:   c.lingerMisses.Load(),
		LingerStops:    c.lingerStops.Load(),
		RxInterrupted:  c.rxInterrupted.Load(),
		TxGSOMessages:  c.txGSOMessages.Load(),
		GSOFallbacks:   c.gsoFallbacks.Load(),
		GSO:            gsoMax > 0,
		GSOMaxSegment:  gsoMax,
		GRO:            l.gro,
		GROError:       l.groErr,
		RcvBuf:         l.rcvBuf,
		SndBuf:         l.sndBuf,
	}
}

// closeEpoll closes the receive goroutine's epoll descriptor.
func (l *Link) closeEpoll() {
	l.tok.mu.Lock()
	defer l.tok.mu.Unlock()
	if l.epFile != nil {
		l.epFile.Close()
	} else if l.epfd >= 0 {
		unix.Close(l.epfd)
	}
	l.epfd = -1
}
