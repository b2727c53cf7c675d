package udplink

import (
	"errors"
	"net"

	"github.com/krfs/krfs/verbs/softnic/link"
)

// DefaultSocketBuf is the SO_RCVBUF/SO_SNDBUF size Open asks for when
// Config.SocketBuf is zero.
const DefaultSocketBuf = 8 << 20

// Largest UDP payloads: an IPv4 datagram is at most 65535 bytes including
// its 20-byte IP and 8-byte UDP headers; an IPv6 payload length (which
// excludes the 40-byte IPv6 header) is at most 65535 including the UDP
// header.
const (
	MaxDatagramIPv4 = 65535 - 20 - 8
	MaxDatagramIPv6 = 65535 - 8
)

// Config configures Open.
type Config struct {
	// Addr is the numeric local address to bind, "127.0.0.1:0" or
	// "[::1]:4791"; port 0 picks a free port. IPv6 zones are not
	// supported.
	Addr string
	// GSO sends runs of equal-sized packets to one destination as one
	// UDP_SEGMENT message.
	GSO bool
	// GRO asks the kernel to coalesce received datagrams (UDP_GRO), which
	// the link then delivers packet by packet.
	GRO bool
	// SocketBuf is the SO_RCVBUF and SO_SNDBUF size in bytes, set with
	// SO_*BUFFORCE when the process may (root), else capped by the
	// net.core.[rw]mem_max sysctls. 0 means DefaultSocketBuf; a negative
	// value keeps the kernel's default.
	SocketBuf int
}

// DefaultConfig is the recommended configuration for addr: GSO and GRO on,
// DefaultSocketBuf buffers.
func DefaultConfig(addr string) Config {
	return Config{Addr: addr, GSO: true, GRO: true}
}

// Errors from Open and Send. Open's errors also wrap the system call's
// errno, so errors.Is(err, unix.EADDRINUSE) works.
var (
	// ErrBadAddress is wrapped by Open's error for an address that is not
	// a numeric IP:port.
	ErrBadAddress = errors.New("udplink: bad address")
	// ErrClosed is returned by Send after Close. It is net.ErrClosed.
	ErrClosed = net.ErrClosed
	// ErrUnsupported is returned by Open on systems other than Linux.
	ErrUnsupported = errors.New("udplink: unsupported on this operating system")
)

// Counters are the link's counters and offload state. Of link.Stats,
// TxDrops counts packets dropped on EAGAIN or ENOBUFS (also in TxErrors).
type Counters struct {
	link.Stats

	RxBatches     uint64 // datagrams that carried more than one packet (GRO)
	RxSteered     uint64 // packets whose payload the kernel placed in steered memory
	RxReassembled uint64 // steered packets whose header length was mispredicted, copied into scratch (peek path)
	// RxMispredicted counts payloads the kernel placed in memory a
	// link.Predictor predicted but that belonged elsewhere: each one was
	// copied back into scratch (and from there by the receiver where it
	// belongs). Zero while every prediction is right.
	RxMispredicted uint64
	RxMalformed    uint64 // packets delivered raw because their header did not parse
	RxProbes       uint64 // receive-path probes the device sent itself (link.IsProbe), delivered raw, not malformed
	PMTUProbes     uint64 // route MTU look-ups (one per destination, again after TooBig)
	TooBig         uint64 // packets the kernel refused with EMSGSIZE: larger than the path MTU (never fragmented)
	Kicks          uint64 // Wake datagrams received (a driver blocked receiving had to look again)
	RxTimeouts     uint64 // blocking receives holding RxLock that returned after rxWaitMax with nothing (they bound a lost kick)
	RxInterrupted  uint64 // blocking receives holding RxLock that a signal interrupted (EINTR: with a receive timeout the kernel does not restart them)
	// EpollMoves counts epoll_ctl calls that took the socket out of the
	// receive goroutine's epoll set or put it back. A synchronous caller
	// that drives again within lingerFor of its last Drive makes none
	// (see "Run to completion" in the package doc).
	EpollMoves   uint64
	LingerRearms uint64 // times the receive goroutine put the socket back after drivers stopped coming
	// LingerMisses counts lapses that found a request (or a CM message or
	// handshake) waiting: it arrived after the last driver left, and
	// nobody received it until the lapse. Each one turns lingering off for
	// lingerOffFor (1 s). A late response or acknowledgment found there is
	// not a miss: nobody waits on it.
	LingerMisses uint64
	LingerStops  uint64 // lingers ended by StopLinger (a waiter that does not drive)

	TxGSOMessages uint64 // messages sent with UDP_SEGMENT
	GSOFallbacks  uint64 // GSO messages the kernel rejected, resent one datagram each

	GSO           bool  // GSO currently in use
	GSOMaxSegment int   // largest packet still sent with GSO (0 if GSO is off)
	GRO           bool  // UDP_GRO is enabled on the socket
	GROError      error // why GRO is off although Config.GRO asked for it
	RcvBuf        int   // SO_RCVBUF as the kernel reports it
	SndBuf        int   // SO_SNDBUF as the kernel reports it
}
