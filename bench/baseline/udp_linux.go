//go:build linux

package baseline

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDPPingPong measures iters round trips of size-byte datagrams between a
// client and an echo server, both on h's address, each on its own blocking
// socket driven by raw sendto/recvfrom system calls (no netpoller). A few
// untimed round trips run first. It returns one duration per timed round
// trip: from just before the client's sendto to just after its recvfrom.
//
// A lost datagram makes it fail with ErrNoReply after a second; on
// loopback that does not happen in practice.
func (h Host) UDPPingPong(iters int, size int) (Latencies, error) {
	if err := checkUDPArgs("UDPPingPong", iters, size); err != nil {
		return nil, err
	}
	a, err := h.addr()
	if err != nil {
		return nil, err
	}
	srv, err := openUDP(a, 0)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	cli, err := openUDP(a, 0)
	if err != nil {
		return nil, err
	}
	defer cli.close()

	echo := startEcho(srv, size, false)
	lat, err := pingPong(cli, &srv.local, iters, size)
	if serr := echo.stop(); err == nil && serr != nil {
		return nil, serr
	}
	return lat, err
}

func pingPong(cli *udpSock, to *sockaddr, iters, size int) (Latencies, error) {
	req := make([]byte, size)
	for i := range req {
		req[i] = byte(i)
	}
	resp := make([]byte, size)
	lat := make(Latencies, iters)
	for i := -Warmup; i < iters; i++ {
		t0 := time.Now()
		if err := sendto(cli.fd, req, to); err != nil {
			return nil, fmt.Errorf("baseline: UDPPingPong sendto: %w", err)
		}
		n, err := recvfrom(cli.fd, resp, nil)
		d := time.Since(t0)
		if err == unix.EAGAIN {
			return nil, fmt.Errorf("%w: UDP echo not back within %v", ErrNoReply, udpTimeout)
		}
		if err != nil {
			return nil, fmt.Errorf("baseline: UDPPingPong recvfrom: %w", err)
		}
		if n != size {
			return nil, fmt.Errorf("baseline: UDPPingPong: echo of %d bytes, want %d", n, size)
		}
		if i >= 0 {
			lat[i] = d
		}
	}
	return lat, nil
}

// EchoRate measures how many size-byte requests per second an echo server
// answers when a client keeps outstanding requests in flight, for about d.
// Both ends are blocking sockets on h's address driven by raw system calls
// and batch: the server receives up to 64 requests per recvmmsg and echoes
// them with one sendmmsg; the client waits for at least one reply per
// recvmmsg and sends as many new requests with one sendmmsg.
//
// The rate counts replies received between the moment the first requests
// were sent and the first batch received after d. If the client sees no
// reply for a second it assumes its requests were lost and sends
// outstanding new ones; the lost time stays in the rate. It fails with
// ErrNoReply if nothing ever comes back or losses repeat.
func (h Host) EchoRate(outstanding int, size int, d time.Duration) (opsPerSec float64, err error) {
	if err := checkUDPArgs("EchoRate", outstanding, size); err != nil {
		return 0, err
	}
	if outstanding > MaxOutstanding {
		return 0, fmt.Errorf("baseline: EchoRate: outstanding %d > %d", outstanding, MaxOutstanding)
	}
	if d <= 0 {
		return 0, fmt.Errorf("baseline: EchoRate: duration %v <= 0", d)
	}
	a, err := h.addr()
	if err != nil {
		return 0, err
	}
	// Socket buffers large enough for every request in flight (the kernel
	// charges about 1 KiB per small datagram beyond its payload).
	bufBytes := min(max(2*outstanding*(size+1024), 256<<10), 16<<20)
	srv, err := openUDP(a, bufBytes)
	if err != nil {
		return 0, err
	}
	defer srv.close()
	cli, err := openUDP(a, bufBytes)
	if err != nil {
		return 0, err
	}
	defer cli.close()

	echo := startEcho(srv, size, true)
	rate, err := echoClient(cli, &srv.local, outstanding, size, d)
	if serr := echo.stop(); err == nil && serr != nil {
		return 0, serr
	}
	return rate, err
}

// mmsgBatch is how many datagrams one recvmmsg may return.
const mmsgBatch = 64

// maxLossRefills bounds how often EchoRate refills a window it believes
// lost before it gives up.
const maxLossRefills = 3

func echoClient(cli *udpSock, to *sockaddr, outstanding, size int, d time.Duration) (float64, error) {
	req := make([]byte, size)
	reqIov := &unix.Iovec{Base: unsafe.SliceData(req)}
	reqIov.SetLen(size)
	sends := make([]unix.Mmsghdr, outstanding)
	for i := range sends {
		sends[i].Hdr.Name = (*byte)(unsafe.Pointer(&to.raw))
		sends[i].Hdr.Namelen = to.len
		sends[i].Hdr.Iov = reqIov
		sends[i].Hdr.SetIovlen(1)
	}
	recvs := newMsgs(min(outstanding, mmsgBatch), size, false)

	if err := sendmmsgAll(cli.fd, sends); err != nil {
		return 0, fmt.Errorf("baseline: EchoRate sendmmsg: %w", err)
	}
	start := time.Now()
	deadline := start.Add(d)
	var done, refills int
	for {
		recvs.reset()
		n, err := recvmmsg(cli.fd, recvs.msgs, unix.MSG_WAITFORONE)
		now := time.Now()
		if err == unix.EAGAIN {
			if done == 0 || refills == maxLossRefills {
				return 0, fmt.Errorf("%w: %d echo replies, then none for %v", ErrNoReply, done, udpTimeout)
			}
			if !now.Before(deadline) {
				return float64(done) / now.Sub(start).Seconds(), nil
			}
			refills++
			if err := sendmmsgAll(cli.fd, sends); err != nil {
				return 0, fmt.Errorf("baseline: EchoRate sendmmsg: %w", err)
			}
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("baseline: EchoRate recvmmsg: %w", err)
		}
		for i := range n {
			if recvs.msgs[i].Len == uint32(size) {
				done++
			}
		}
		if !now.Before(deadline) {
			return float64(done) / now.Sub(start).Seconds(), nil
		}
		if err := sendmmsgAll(cli.fd, sends[:n]); err != nil {
			return 0, fmt.Errorf("baseline: EchoRate sendmmsg: %w", err)
		}
	}
}

// echoServer answers every datagram on its socket with the same bytes,
// from its own goroutine, until stop.
type echoServer struct {
	sock     *udpSock
	stopping atomic.Bool
	done     chan error // the goroutine's result; buffered
}

// startEcho starts serving sock with datagrams of up to size bytes, one at
// a time with recvfrom/sendto, or in batches with recvmmsg/sendmmsg.
func startEcho(sock *udpSock, size int, batch bool) *echoServer {
	s := &echoServer{sock: sock, done: make(chan error, 1)}
	go func() {
		if batch {
			s.done <- s.serveBatch(size)
		} else {
			s.done <- s.serve(size)
		}
	}()
	return s
}

// stop ends the server and waits for its goroutine. Shutting the socket
// down wakes a receive blocked in the kernel (on an unconnected UDP socket
// shutdown reports ENOTCONN but still wakes it); the receive timeout is the
// backstop. stop returns what the server failed with, if anything. The
// caller still owns and closes the socket.
func (s *echoServer) stop() error {
	s.stopping.Store(true)
	_ = unix.Shutdown(s.sock.fd, unix.SHUT_RDWR)
	return <-s.done
}

func (s *echoServer) serve(size int) error {
	buf := make([]byte, size)
	from := new(sockaddr)
	for {
		n, err := recvfrom(s.sock.fd, buf, from)
		if s.stopping.Load() {
			return nil
		}
		if err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("baseline: echo server recvfrom: %w", err)
		}
		if err := sendto(s.sock.fd, buf[:n], from); err != nil && !s.stopping.Load() {
			return fmt.Errorf("baseline: echo server sendto: %w", err)
		}
	}
}

func (s *echoServer) serveBatch(size int) error {
	m := newMsgs(mmsgBatch, size, true)
	for {
		m.reset()
		n, err := recvmmsg(s.sock.fd, m.msgs, unix.MSG_WAITFORONE)
		if s.stopping.Load() {
			return nil
		}
		if err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("baseline: echo server recvmmsg: %w", err)
		}
		for i := range n {
			m.iovs[i].SetLen(int(m.msgs[i].Len))
		}
		if err := sendmmsgAll(s.sock.fd, m.msgs[:n]); err != nil && !s.stopping.Load() {
			return fmt.Errorf("baseline: echo server sendmmsg: %w", err)
		}
	}
}

// msgs is a recvmmsg vector: one buffer of size bytes per message and,
// if wanted, room for each sender's address.
type msgs struct {
	size  int
	bufs  []byte
	iovs  []unix.Iovec
	names []sockaddr
	msgs  []unix.Mmsghdr
}

func newMsgs(n, size int, withNames bool) *msgs {
	m := &msgs{
		size: size,
		bufs: make([]byte, n*size),
		iovs: make([]unix.Iovec, n),
		msgs: make([]unix.Mmsghdr, n),
	}
	if withNames {
		m.names = make([]sockaddr, n)
	}
	for i := range m.msgs {
		m.iovs[i].Base = &m.bufs[i*size]
		m.msgs[i].Hdr.Iov = &m.iovs[i]
		m.msgs[i].Hdr.SetIovlen(1)
		if withNames {
			m.msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&m.names[i].raw))
		}
	}
	return m
}

// reset restores the full buffer lengths and address room before a
// receive.
func (m *msgs) reset() {
	for i := range m.msgs {
		m.iovs[i].SetLen(m.size)
		if m.names != nil {
			m.msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		}
	}
}

// udpSock is a blocking UDP socket bound to a local address, with a
// receive timeout of udpTimeout.
type udpSock struct {
	fd      int
	local   sockaddr
	localAP netip.AddrPort
}

// openUDP opens a socket bound to an ephemeral port of a. A positive
// bufBytes sets both socket buffer sizes (best effort).
func openUDP(a netip.Addr, bufBytes int) (*udpSock, error) { return openUDPPort(a, 0, bufBytes) }

// openUDPPort is openUDP on a given port (0: ephemeral).
func openUDPPort(a netip.Addr, port uint16, bufBytes int) (*udpSock, error) {
	family := unix.AF_INET6
	if a.Is4() {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("baseline: UDP socket: %w", err)
	}
	s := &udpSock{fd: fd}
	if err := s.setup(a, port, bufBytes); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return s, nil
}

func (s *udpSock) setup(a netip.Addr, bindPort uint16, bufBytes int) error {
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: a.As16(), Port: int(bindPort)}
	if a.Is4() {
		sa = &unix.SockaddrInet4{Addr: a.As4(), Port: int(bindPort)}
	}
	if err := unix.Bind(s.fd, sa); err != nil {
		return fmt.Errorf("baseline: bind UDP socket to %v: %w", a, err)
	}
	got, err := unix.Getsockname(s.fd)
	if err != nil {
		return fmt.Errorf("baseline: getsockname: %w", err)
	}
	var port int
	switch got := got.(type) {
	case *unix.SockaddrInet4:
		port = got.Port
	case *unix.SockaddrInet6:
		port = got.Port
	}
	s.localAP = netip.AddrPortFrom(a, uint16(port))
	s.local.set(s.localAP)
	tv := unix.NsecToTimeval(udpTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("baseline: SO_RCVTIMEO: %w", err)
	}
	if bufBytes > 0 {
		// The FORCE variants pass the sysctl caps when running as root.
		if unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufBytes) != nil {
			_ = unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, bufBytes)
		}
		if unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufBytes) != nil {
			_ = unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, bufBytes)
		}
	}
	return nil
}

func (s *udpSock) close() { unix.Close(s.fd) }

// sockaddr is a socket address in the kernel's layout, for raw system
// calls. raw has room for IPv4 and IPv6; len is the used length.
type sockaddr struct {
	raw unix.RawSockaddrInet6
	len uint32
}

func (s *sockaddr) set(ap netip.AddrPort) {
	s.raw = unix.RawSockaddrInet6{}
	if a := ap.Addr(); a.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&s.raw))
		sa.Family = unix.AF_INET
		sa.Port = htons(ap.Port())
		sa.Addr = a.As4()
		s.len = unix.SizeofSockaddrInet4
		return
	}
	s.raw.Family = unix.AF_INET6
	s.raw.Port = htons(ap.Port())
	s.raw.Addr = ap.Addr().As16()
	s.len = unix.SizeofSockaddrInet6
}

// htons returns the in-memory value whose bytes are p in network order.
func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// The system call wrappers below retry EINTR: Go preempts goroutines with
// signals, and a socket call with a timeout is not restarted after one.
// They return the bare errno; EAGAIN means the receive timeout expired.

func sendto(fd int, b []byte, to *sockaddr) error {
	for {
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd),
			uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
			unix.MSG_NOSIGNAL, uintptr(unsafe.Pointer(&to.raw)), uintptr(to.len))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

// recvfrom receives one datagram into b and returns its length. If from is
// not nil it receives the sender's address.
func recvfrom(fd int, b []byte, from *sockaddr) (int, error) {
	for {
		var n uintptr
		var e unix.Errno
		if from == nil {
			n, _, e = unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd),
				uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), 0, 0, 0)
		} else {
			from.len = unix.SizeofSockaddrInet6
			n, _, e = unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd),
				uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), 0,
				uintptr(unsafe.Pointer(&from.raw)), uintptr(unsafe.Pointer(&from.len)))
		}
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// recvmmsg receives up to len(msgs) datagrams (x/sys/unix has no wrapper).
func recvmmsg(fd int, msgs []unix.Mmsghdr, flags int) (int, error) {
	for {
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd),
			uintptr(unsafe.Pointer(unsafe.SliceData(msgs))), uintptr(len(msgs)), uintptr(flags), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// sendmmsgAll sends every message of msgs, with as many sendmmsg calls as
// the kernel needs.
func sendmmsgAll(fd int, msgs []unix.Mmsghdr) error {
	for len(msgs) > 0 {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd),
			uintptr(unsafe.Pointer(unsafe.SliceData(msgs))), uintptr(len(msgs)), unix.MSG_NOSIGNAL, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		if n == 0 {
			return unix.EIO // cannot happen for a non-empty vector; never spin
		}
		msgs = msgs[n:]
	}
	return nil
}
