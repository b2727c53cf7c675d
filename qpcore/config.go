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
	DefaultTick         = 20 * time.Millisecond
	DefaultMemCacheMax  = 1024
	DefaultMemCacheSize = 32 << 20
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
	// are kept posted for messages; SendBuffers bounce buffers of the same
	// size carry small messages out. Messages of MsgThreshold bytes or
	// more go by zero-copy rendezvous. MsgTimeout bounds how long a Send
	// waits for a busy receiver (RNR) or for a rendezvous to be pulled.
	RecvBuffers  int
	SendBuffers  int
	MsgThreshold int
	MsgTimeout   time.Duration

	// MemCacheMax bounds the cache of automatic registrations of caller
	// buffers (see Node.Register) in entries, MemCacheSize in bytes: a
	// cached registration keeps its buffer alive, so MemCacheSize bounds
	// the memory the cache holds on to. A buffer larger than MemCacheSize
	// is registered for its operation only.
	MemCacheMax  int
	MemCacheSize int

	// NoDrive makes synchronous callers sleep until the dispatcher
	// delivers their completion instead of receiving on their own
	// goroutine (see verbs.DrivenCQ); for comparison and debugging.
	NoDrive bool

	// Tick is the housekeeping period (RC idle checks, passive QP reclaim).
	Tick time.Duration

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
	def(&c.MemCacheMax, DefaultMemCacheMax)
	def(&c.MemCacheSize, DefaultMemCacheSize)
	defd(&c.Tick, DefaultTick)
	c.Clock = clock.OrSystem(c.Clock)
	c.MaxRegions = min(c.MaxRegions, maxDirRecords)
}
