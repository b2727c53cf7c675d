// Package link is the seam between the softnic protocol engine and a
// network: the Link interface that carries softnic packets between devices,
// the Receiver a link delivers to, and the Clock that all softnic timers
// read. Implementations: udplink (real UDP sockets, the default) and
// softnictest (an in-memory network that drops, duplicates, reorders and
// delays packets under a manual clock).
//
// # Receive contract and zero-copy steering
//
// A receiver that implements Predictor lets a link place payloads before
// it has seen any header (one receive call per datagram; see Predictor);
// the link still calls Steer and Deliver for every packet as below, after
// the receive, and Steer then decides whether the prediction was right.
// Without Predictor, a link learns a packet's header before it places the
// payload. For every
// packet it calls Receiver.Steer with the header bytes and the payload
// length; Steer may return a slice of exactly that length (memory the
// payload should land in, typically a READ response's destination), or
// nil. The link then places the
// payload there — for UDP, the kernel's socket copy writes straight into
// it — or into a scratch buffer, and calls Receiver.Deliver with the real
// header and the payload slice. Deliver learns whether steering happened by
// comparing the payload slice with what it expects; it must not assume it.
//
// When a link receives several packets at once (UDP GRO coalescing), it
// knows only the first header before receiving. It then calls Steer for
// packet i of the batch with the first packet's header and index i; the
// receiver predicts (for example PSN+i of the same QP). Predictions can be
// wrong; Deliver always sees the real header, so a wrong prediction costs a
// copy or a retransmission, never corruption of accepted data. But the
// bytes of a wrongly placed packet stay in the steered memory until the
// right packet replaces them, so receivers steer only into memory that is
// not yet valid (the next bytes expected by an in-progress transfer) AND
// that nobody else can see until the transfer completes: a READ's private
// destination, never a WRITE's target that peers read and local programs
// map. A real NIC never places one packet's bytes where another's belong;
// a link may, so the receiver must make sure no one can tell.
//
// Steer and Deliver of one packet (or one batch) are called on the same
// goroutine (the link's, or a Driver's caller holding the receive token),
// in that order, with no other Steer or Deliver of the same link in
// between; Receiver.RxLock/RxUnlock bracket them so that the engine can
// keep steered memory alive (a flushed READ's buffer must not be written
// after its completion was reported).
package link

import (
	"errors"
	"net/netip"
	"time"

	"github.com/krfs/krfs/clock"
)

// Packet is one datagram to send: Hdr followed by Payload. The link does
// not retain either slice after Send returns.
type Packet struct {
	To      netip.AddrPort
	Hdr     []byte
	Payload []byte
}

// Len is the datagram length.
func (p *Packet) Len() int { return len(p.Hdr) + len(p.Payload) }

// Link carries datagrams between devices.
type Link interface {
	// LocalAddr is the address other devices send to.
	LocalAddr() netip.AddrPort
	// Send transmits packets in order. It may group consecutive packets to
	// one destination (GSO, sendmmsg). It returns once the payloads have
	// been copied out; errors are transient link errors (the protocol's
	// retransmission covers lost packets).
	Send(pkts []Packet) error
	// Start begins delivering received packets to r from the link's own
	// goroutine(s). It is called once.
	Start(r Receiver)
	// MaxDatagram is the largest datagram the link carries.
	MaxDatagram() int
	// MaxDatagramTo is the largest datagram that reaches to without IP
	// fragmentation (the path MTU less the IP and UDP headers), at most
	// MaxDatagram. A link never fragments: a larger datagram is dropped
	// and counted. It is cheap after the first call for a destination.
	MaxDatagramTo(to netip.AddrPort) int
	// Stats reports link counters.
	Stats() Stats
	// Close stops delivery and waits for the link's goroutines to exit.
	Close() error
}

// Stats are link-level counters.
type Stats struct {
	TxDatagrams, RxDatagrams uint64
	TxBytes, RxBytes         uint64
	TxSyscalls, RxSyscalls   uint64
	TxErrors, RxErrors       uint64
	TxDrops                  uint64 // packets dropped for want of room in the network's queue (also in TxErrors)
	Truncated                uint64 // datagrams too large for the receive buffers
	RxCopies                 uint64 // payload segments the link copied: received into predicted memory they did not belong to (Predictor), copied back
}

// DonePoll is the longest a Driver holding the receive token waits in a
// receive without looking at Drive's done channel.
const DonePoll = 20 * time.Millisecond

// Driver is implemented by links whose receive call can run on the
// goroutine of a caller waiting for a completion (run-to-completion, see
// verbs.DrivenCQ). The link keeps one receive token: at most one goroutine
// receives at a time, its own receive goroutine only while nobody drives,
// and the holder delivers everything it receives to the Receiver given to
// Start.
type Driver interface {
	// Drive calls ready, and while it reports false takes the receive
	// token when it is free (or handed over) and receives and delivers
	// packets on the calling goroutine, calling ready after each batch.
	// Without the token it sleeps until wake receives, done is closed, or
	// the token is handed to it. It returns nil once ready reported true,
	// ErrDone when done was closed first, and net.ErrClosed after Close.
	// On return the token passes to the next caller waiting for it, or
	// back to the link's goroutine. Holding the token, it looks at done
	// at least every DonePoll even if nothing arrives; a done that closes
	// sooner is seen at once only if the caller also calls Wake.
	Drive(done, wake <-chan struct{}, ready func() bool) error
	// Wake makes a caller blocked receiving in Drive call its ready again
	// (by sending the link an empty datagram); it costs two atomic
	// operations when no caller is blocked receiving.
	Wake()
}

// Lingerer is implemented by a Driver whose socket may stay unwatched for
// a short while after the last driver left (udplink's lingering), so that
// a synchronous caller's next Drive costs no system call. Datagrams that
// arrive meanwhile wait for the next driver or the end of the linger.
type Lingerer interface {
	// StopLinger ends a linger now: call it before waiting for a
	// completion without driving. It costs one atomic load when the link
	// is not lingering.
	StopLinger()
}

// Quiescer is implemented by a Receiver that can tell whether it has
// operations outstanding whose completions someone may wait for without
// driving. A lingering link asks it when the last driver leaves and does
// not linger while it reports false.
type Quiescer interface {
	Quiet() bool
}

// ErrDone is returned by Driver.Drive when its done channel was closed
// before ready reported true.
var ErrDone = errors.New("link: drive abandoned (done closed)")

// Receiver consumes packets from a link.
type Receiver interface {
	// RxLock and RxUnlock bracket each Steer/Deliver sequence.
	RxLock()
	RxUnlock()
	// Steer returns where the payload of packet index of a received batch
	// should land: a slice of len payloadLen, or nil for scratch. hdr is the
	// header of the batch's first packet (see package doc).
	Steer(from netip.AddrPort, hdr []byte, index int, payloadLen int) []byte
	// Deliver hands over one received packet. hdr and payload are valid
	// only during the call. Malformed packets are the receiver's to count.
	Deliver(from netip.AddrPort, hdr []byte, payload []byte)
}

// Prediction is where a receiver expects the payload of one packet of the
// next datagram: the packet's header length and its payload's memory.
type Prediction struct {
	HdrLen  int
	Payload []byte
}

// Predictor is implemented by receivers that can say, before a datagram
// arrives, where the payloads of its packets most likely belong (the next
// bytes of the oldest READ in progress), so that a link receives each
// datagram with one system call straight into place, with no header peek.
//
// Predict fills p with the expected packets of the next datagram in order
// and returns how many it filled (0: no prediction); in is the link's
// Interrupter (the same every call). queued says that a datagram is
// known to be waiting (the link receives without blocking): Predict must
// then not wait for anything (a lock held by a poster, say), but answer
// 0 rather than keep the datagram waiting; when queued is false the
// receive would block anyway, and Predict may wait. The link calls it
// with RxLock held and keeps RxLock held until it has received the
// datagram and delivered it, so the predicted memory stays the receive
// path's; it may block in its receive call meanwhile. The same rules as
// for Steer apply: predict only memory that is not yet valid and that
// nobody else can see until the transfer completes, since a wrong
// prediction leaves another datagram's bytes there. After the receive, the link
// calls Steer and Deliver as usual; a packet counts as predicted only if
// Steer returns exactly the predicted memory and its header has the
// predicted length. Any other payload bytes the kernel placed in predicted
// memory are copied where they belong, and counted. A receiver that does
// not implement Predictor gets the peek path (two receive calls).
//
// A receiver that implements Predictor and locks out its receive path from
// other goroutines must first make Predict return 0 (publish the request,
// with a sequentially consistent atomic), then call InterruptRecv of the
// Interrupter that Predict was given, then wait for the lock: a link
// blocked in a predicted receive returns from it. (The Interrupter comes
// with Predict rather than from the Link the receiver was opened with,
// which may be a wrapper.)
type Predictor interface {
	Predict(p []Prediction, in Interrupter, queued bool) int
}

// Interrupter is given by a link that may block in a receive call while
// holding a Predictor's RxLock.
type Interrupter interface {
	// InterruptRecv makes a receive call blocked with a prediction return
	// soon (for UDP, by sending the link an empty datagram). It costs one
	// atomic load when no such call is blocked.
	InterruptRecv()
}

// Clock is the time source of the softnic engine: the module's clock.Clock
// (an alias, so that links, devices and the layers above share one type).
type Clock = clock.Clock

// Timer is a stoppable timer from a Clock.
type Timer = clock.Timer

// SystemClock is the real clock.
type SystemClock = clock.System

// ProbeTag starts a receive-path probe: a datagram a device sends itself
// to learn whether its receive path keeps up (softnic's ACK timeouts).
// Its first byte is not a softnic header's magic, so a link delivers it
// whole, as it would a malformed packet; IsProbe tells them apart for the
// link's counters. What the rest means is the device's business.
const ProbeTag = "softnic\x00"

// IsProbe reports whether b starts like a receive-path probe.
func IsProbe(b []byte) bool {
	return len(b) >= len(ProbeTag) && string(b[:len(ProbeTag)]) == ProbeTag
}

// SelfAddr is where a link bound to local reaches itself: local, or
// loopback on local's port when local's address is unspecified.
func SelfAddr(local netip.AddrPort) netip.AddrPort {
	a := local.Addr()
	if a.IsUnspecified() {
		if a.Is6() {
			a = netip.IPv6Loopback()
		} else {
			a = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
	}
	return netip.AddrPortFrom(a, local.Port())
}
