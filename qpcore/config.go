package qpcore

import (
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/dct"
)

// Defaults of Config fields left zero.
const (
	DefaultDCIs         = dct.DefaultDCIs
	DefaultDCIDepth     = dct.DefaultDepth
	DefaultDCIQuota     = dct.DefaultQuota
	DefaultRCCap        = 32
	DefaultRCDepth      = 256
	DefaultRCThreshold  = 2000
	DefaultRCWindow     = 100 * time.Millisecond
	DefaultRCIdle       = 2 * time.Second
	DefaultPeerTimeout  = time.Second
	DefaultMaxPeers     = 4096
	DefaultVQPDepth     = 128
	DefaultMaxRegions   = 50
	DefaultRecvBuffers  = 64
	DefaultSendBuffers  = 16
	DefaultMsgThreshold = 64 << 10
	DefaultMsgTimeout   = 10 * time.Second
	DefaultPortDepth    = 16
	DefaultStageAfter   = 5 * time.Millisecond
	DefaultStageMax     = 64 << 20
	DefaultTick         = 20 * time.Millisecond
	DefaultMemCacheMax  = 1024
	DefaultMemCacheSize = 32 << 20
	// DefaultTransport is the transport of a node that names none.
	DefaultTransport = "softnic/udp"
)

// Config configures a Node. Zero fields take the defaults above.
type Config struct {
	// GID is this node's cluster-wide ID (it can be set later with
	// SetGID, once the meta service assigned one). It is carried in
	// messages as their source.
	GID uint32
	// Incarnation identifies this start of the node; 0 draws a random one.
	Incarnation uint64

	// DCIs is the fixed DCI pool size; DCIDepth each DCI's send queue
	// depth; DCIQuota the WRs a peer may post on its DCI per turn while
	// other peers wait (see package dct).
	DCIs     int
	DCIDepth int
	DCIQuota int

	// RCCap bounds this node's active RC QPs (connections it initiated);
	// RCDepth is their send queue depth. Passively accepted RC QPs are
	// bounded by 4*RCCap.
	RCCap   int
	RCDepth int
	// A peer becomes hot, and gets an RC QP built in the background, once
	// RCThreshold operations were posted to it within RCWindow. An RC QP
	// unused for RCIdle is torn down; when the RC pool is full, the least
	// recently used RC QP idle for at least RCWindow is evicted. DisableRC
	// keeps every peer on DC.
	//
	// The default threshold, 2,000 operations in 100 ms (20,000/s), is a
	// peer that keeps a DCI busy about a third of the time at this
	// machine's ~15 us round trip: worth a private QP that no longer
	// competes for the pool. RCCap 32 bounds the RC side to about 32 x 9
	// KiB per node whatever the cluster size (UCX measured the RC/DC
	// crossover at ~180 endpoints on hardware; a node rarely has more than
	// a few dozen peers that hot at once).
	RCThreshold int
	RCWindow    time.Duration
	RCIdle      time.Duration
	DisableRC   bool

	// NoDC runs the node RC-only, for a device without DC transport (rxe,
	// siw, RNICs other than mlx5; see nic.Opened.DC): the node creates no
	// DCI and no DCT, publishes DCT number 0, and reaches every peer over
	// an RC QP connected on first use. A node with DC reaches a peer that
	// published DCT number 0 the same way, whatever DisableRC says. RCCap
	// still bounds the active RC QPs: see "RC-only" in the package doc.
	NoDC bool

	// NoCoalesce posts every synchronous operation at once. By default a
	// synchronous operation that finds others of its peer in flight waits
	// in the peer's queue, and the next completion posts everything that
	// queued meanwhile with one doorbell: concurrent callers (parallel
	// preads of one file) share doorbells, at the price of waiting up to
	// one round trip; a lone caller never waits.
	NoCoalesce bool

	// PeerTimeout is the hard bound on every READ, WRITE and atomic,
	// success or error (see "Timeouts and liveness" in the package doc):
	// one transport attempt lasts PeerTimeout/4 (the QPs' ACK timeout is
	// PeerTimeout/32 with 7 retries), a peer is declared down after 3
	// consecutive silent attempts spanning 3/4 of PeerTimeout.
	PeerTimeout time.Duration

	// MaxPeers bounds the peers this node keeps state for (metadata,
	// region directory); peers with no open VQP are evicted LRU beyond it.
	MaxPeers int
	// VQPDepth is how many operations one VQP may have outstanding (posted
	// and not yet completed, or completed and not yet polled).
	VQPDepth int
	// MaxRegions is the capacity of this node's region directory.
	MaxRegions int

	// RecvBuffers receive buffers of MsgThreshold bytes (plus a header)
	// are kept posted for messages once a port is bound (a few before;
	// see Stats.MsgRecvBuffers); SendBuffers bounce buffers of the same
	// size carry small messages out. Messages of MsgThreshold bytes or
	// more go by zero-copy rendezvous. MsgTimeout bounds how long a Send
	// waits for a busy receiver (RNR) or for a rendezvous to be pulled.
	RecvBuffers  int
	SendBuffers  int
	MsgThreshold int
	MsgTimeout   time.Duration
	// PortDepth bounds the messages queued on one port; a message to a
	// full port is refused and its sender retries (see msg.go). Keep it
	// below RecvBuffers, so that one full port leaves receive buffers to
	// the others.
	PortDepth int
	// A large (rendezvous) message that no reader took within
	// MsgStageAfter is pulled into the receiver's own memory, so that its
	// sender's Send completes without waiting for the reader; the reader
	// then gets a copy (counted) instead of a zero-copy READ. At most
	// MsgStageMax bytes are staged at once; beyond, senders wait for
	// their readers as before.
	MsgStageAfter time.Duration
	MsgStageMax   int

	// MemCacheMax bounds the cache of automatic registrations of caller
	// buffers (see Node.Register) in entries, MemCacheSize in bytes: a
	// cached registration keeps its buffer alive, so MemCacheSize bounds
	// the memory the cache holds on to. A buffer larger than MemCacheSize
	// is registered for its operation only.
	MemCacheMax  int
	MemCacheSize int

	// NoDrive makes synchronous callers wait for the CQ's notification
	// (the dispatcher's hand-off) instead of driving: by default, on a
	// device that supports it (verbs.DrivenCQ), a synchronous caller
	// receives for the device on its own goroutine until its completion
	// is there (run to completion). Driving saves a thread wake-up per
	// operation on the path users take, another process across a link
	// (see "Run to completion" in docs/architecture.md).
	NoDrive bool

	// Tick is the housekeeping period (RC idle checks, passive QP reclaim).
	Tick time.Duration

	// Transport names the wire protocol this node's device speaks
	// ("softnic/udp", "rdma/roce", "rdma/ib": the backend's), published in
	// its meta entry; a peer of another transport is refused with
	// ErrTransportMismatch. Empty is DefaultTransport.
	Transport string

	// Clock is the source of every time read, timer and timeout of the
	// node (RC hot/idle windows, peer timeouts, message deadlines, RNR
	// back-off, housekeeping); nil is the system clock. Tests pass a
	// manual clock (softnictest.ManualClock) so that nothing depends on
	// how busy the machine is.
	Clock clock.Clock
}

func (c *Config) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.DCIs, DefaultDCIs)
	def(&c.DCIDepth, DefaultDCIDepth)
	def(&c.DCIQuota, DefaultDCIQuota)
	def(&c.RCCap, DefaultRCCap)
	def(&c.RCDepth, DefaultRCDepth)
	def(&c.RCThreshold, DefaultRCThreshold)
	defd(&c.RCWindow, DefaultRCWindow)
	defd(&c.RCIdle, DefaultRCIdle)
	defd(&c.PeerTimeout, DefaultPeerTimeout)
	def(&c.MaxPeers, DefaultMaxPeers)
	def(&c.VQPDepth, DefaultVQPDepth)
	def(&c.MaxRegions, DefaultMaxRegions)
	def(&c.RecvBuffers, DefaultRecvBuffers)
	def(&c.SendBuffers, DefaultSendBuffers)
	def(&c.MsgThreshold, DefaultMsgThreshold)
	defd(&c.MsgTimeout, DefaultMsgTimeout)
	def(&c.PortDepth, DefaultPortDepth)
	defd(&c.MsgStageAfter, DefaultStageAfter)
	def(&c.MsgStageMax, DefaultStageMax)
	def(&c.MemCacheMax, DefaultMemCacheMax)
	def(&c.MemCacheSize, DefaultMemCacheSize)
	defd(&c.Tick, DefaultTick)
	c.Clock = clock.OrSystem(c.Clock)
	c.MaxRegions = min(c.MaxRegions, maxDirRecords)
}
