package udplink

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Path MTU. The socket sends with IP_PMTUDISC_DO (and IPV6_PMTUDISC_DO), so
// the kernel never fragments a softnic datagram: one larger than the route
// MTU fails with EMSGSIZE instead. The link learns each destination's route
// MTU once (IP_MTU on a probe socket connected to it, which reports the
// route's MTU including what ICMP "fragmentation needed" taught the
// kernel), caches it, and tells the engine through MaxDatagramTo how large
// a datagram may be; the engine segments messages to fit. An EMSGSIZE
// (the route's MTU shrank) is counted (Counters.TooBig) and drops the
// cached value, so the next message to that destination is probed again.

// Minimum path MTUs every IP host must carry without fragmenting (RFC 791,
// RFC 8200); used when a probe fails.
const (
	minMTUIPv4 = 576
	minMTUIPv6 = 1280
)

// maxPMTUEntries bounds the path MTU cache: a node answers whoever sends
// to it, so the destinations it learns are not all its own choice. When
// full, an arbitrary entry makes room (it is probed again if used again).
const maxPMTUEntries = 4096

// pmtuCache maps destinations to the largest datagram that reaches them
// unfragmented; at most maxPMTUEntries of them.
type pmtuCache struct {
	probeFd int // unbound socket of the link's family and namespace, reconnected per probe

	mu sync.RWMutex            // guards m; probes run with it write-held
	m  map[netip.Addr]*pmtuHit // entries are never modified, only replaced

	// last is the most recent hit, read without mu: a node that talks to
	// one peer at a time (a synchronous caller) asks for the same
	// destination over and over. Replaced on every other hit and cleared
	// by forgetPMTU.
	last atomic.Pointer[pmtuHit]
}

// pmtuHit is one cached destination and its largest datagram.
type pmtuHit struct {
	addr netip.Addr
	n    int
}

// setupPMTU forbids fragmentation on fd and opens the probe socket. It runs
// in Open, in the network namespace of the link's socket.
func (l *Link) setupPMTU(fd int) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil && !l.v6 {
		return err
	}
	if l.v6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO); err != nil {
			return err
		}
	}
	family := unix.AF_INET
	if l.v6 {
		family = unix.AF_INET6
	}
	pfd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return err
	}
	l.pmtu.probeFd = pfd
	l.pmtu.m = make(map[netip.Addr]*pmtuHit)
	return nil
}

// MaxDatagramTo is the largest datagram Send can carry to the destination
// without IP fragmentation: the route MTU minus the IP and UDP headers,
// at most MaxDatagram. The first call for a destination probes the route
// (a few microseconds); later calls read a cache.
func (l *Link) MaxDatagramTo(to netip.AddrPort) int {
	a := to.Addr().Unmap()
	c := &l.pmtu
	if h := c.last.Load(); h != nil && h.addr == a {
		return h.n
	}
	c.mu.RLock()
	h, ok := c.m[a]
	if ok {
		c.last.Store(h) // under mu: forgetPMTU cannot clear last before this
	}
	c.mu.RUnlock()
	if ok {
		return h.n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.m[a]; ok {
		return h.n
	}
	n := l.probeLocked(to)
	if len(c.m) >= maxPMTUEntries {
		for old := range c.m {
			delete(c.m, old)
			break
		}
	}
	c.m[a] = &pmtuHit{a, n}
	l.c.pmtuProbes.Add(1)
	return n
}

// forgetPMTU drops the cached MTU of a destination after EMSGSIZE.
func (l *Link) forgetPMTU(to netip.AddrPort) {
	c := &l.pmtu
	c.mu.Lock()
	delete(c.m, to.Addr().Unmap())
	c.last.Store(nil)
	c.mu.Unlock()
}

// probeLocked asks the kernel for the route MTU towards to. pmtu.mu is
// write-held (the probe socket is shared).
func (l *Link) probeLocked(to netip.AddrPort) int {
	a := to.Addr().Unmap()
	overhead, floor := 20+8, minMTUIPv4
	if a.Is6() {
		overhead, floor = 40+8, minMTUIPv6
	}
	mtu := floor
	var sa unix.RawSockaddrInet6
	port := to.Port()
	if port == 0 {
		port = 9 // any port routes the same
	}
	if namelen := putSockaddr(&sa, netip.AddrPortFrom(a, port), l.v6); namelen != 0 && l.pmtu.probeFd >= 0 {
		fd := l.pmtu.probeFd
		_, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(namelen))
		if e == 0 {
			var v int
			var err error
			if l.v6 {
				v, err = unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU)
			} else {
				v, err = unix.GetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU)
			}
			if err == nil && v > 0 {
				mtu = v
			}
			// Dissolve the association (AF_UNSPEC) for the next probe.
			unspec := unix.RawSockaddr{Family: unix.AF_UNSPEC}
			unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&unspec)), unsafe.Sizeof(unspec))
		}
	}
	return min(max(mtu-overhead, floor-overhead), l.maxDatagram)
}
