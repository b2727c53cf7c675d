package softnictest

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// Defaults for zero Config fields.
const (
	DefaultMaxDatagram  = 65507 // the largest UDP payload over IPv4
	DefaultQueueLimit   = 4096
	DefaultReorderDelay = time.Millisecond
)

// MaxBatch is the most packets delivered in one coalesced batch (the
// kernel's UDP GRO limit).
const MaxBatch = 64

// firstPort is the port of the first address NewLink hands out.
const firstPort = 20000

// Config describes a network: its faults, its clock and its limits. The
// zero Config is a perfect network in real time: no loss, no delay.
type Config struct {
	// Seed seeds the network's random source (math/rand/v2 PCG). Runs with
	// the same Seed, Config and sequence of sends make the same decisions.
	Seed uint64

	// Drop, Dup and Reorder are per-packet probabilities in [0, 1]. A
	// dropped packet is lost. A duplicated packet is delivered twice (the
	// copy up to Jitter later). A reordered packet is held ReorderDelay
	// beyond its due time, so packets sent after it overtake it.
	Drop, Dup, Reorder float64
	// ReorderDelay is the extra delay of a reordered packet; zero means
	// DefaultReorderDelay.
	ReorderDelay time.Duration

	// Delay is every packet's one-way latency; Jitter adds a uniformly
	// random [0, Jitter] to it. Jitter does not reorder the packets of one
	// source-destination pair: with Reorder, Dup and filters off, a pair's
	// packets arrive in the order they were sent.
	Delay, Jitter time.Duration

	// Coalesce is the probability that a packet is received in one batch
	// with the packet received just before it, when GRO could merge them:
	// both are due and come from the same source, and the batch keeps GRO's
	// shape (every packet the size of the first but a shorter last one, at
	// most MaxBatch packets and 65507 bytes). The receiver gets the batch
	// through one Steer/Deliver sequence (see package link).
	Coalesce float64

	// Clock, if set, runs the network on manual time: packets are
	// delivered only by Clock.Advance, Clock.RunNext and Network.Flush, on
	// the goroutine that calls them. A nil Clock runs the network in real
	// time (link.SystemClock), each link delivering from its own goroutine.
	Clock *ManualClock
	// AutoFlush, with a manual Clock, gives each started link a goroutine
	// that delivers packets as soon as they are due at the clock's current
	// time, so that zero-delay traffic flows without Flush; delayed packets
	// still wait for Advance. Delivery order per link is unchanged, but the
	// interleaving with the test goroutine is no longer deterministic.
	AutoFlush bool

	// MaxDatagram is every link's MaxDatagram; zero means
	// DefaultMaxDatagram. Send rejects larger packets.
	MaxDatagram int
	// QueueLimit bounds the packets waiting at one link (its socket
	// buffer); packets beyond it are dropped. Zero means DefaultQueueLimit.
	QueueLimit int
}

// Counters count what a network did to packets. Network.Counters sums
// over all traffic. Link.Counters attributes Sent, Dropped, Unroutable,
// Overflow, Duplicated, Reordered and Delayed to the sending link (drops
// of injected packets to no link), and Delivered, Coalesced, Injected,
// Steered, Mispredicted and Malformed to the receiving link.
//
// Once nothing is queued, Sent + Injected + Duplicated = Delivered +
// Dropped.
type Counters struct {
	Sent       uint64 // datagrams accepted by Send
	Delivered  uint64 // datagrams handed to a Receiver (each copy counts)
	Dropped    uint64 // datagrams lost, for any reason below
	Unroutable uint64 // dropped: no open link at the destination
	Overflow   uint64 // dropped: the destination's queue was full
	Duplicated uint64 // extra copies made (Config.Dup or a Dup verdict)
	Reordered  uint64 // packets held back by Config.Reorder
	Delayed    uint64 // packets held back by a Delay verdict
	Coalesced  uint64 // datagrams delivered in a batch behind its first
	Injected   uint64 // datagrams from Inject

	// Receive path (see the package doc).
	Steered      uint64 // payloads delivered in memory Steer returned
	Mispredicted uint64 // steered packets whose header length was not the predicted one
	Malformed    uint64 // datagrams delivered whole as hdr: no parsable header
}

// counter indexes the counts behind Counters.
type counter int

const (
	cSent counter = iota
	cDelivered
	cDropped
	cUnroutable
	cOverflow
	cDuplicated
	cReordered
	cDelayed
	cCoalesced
	cInjected
	cSteered
	cMispredicted
	cMalformed
	numCounters
)

type counts [numCounters]uint64

func (c *counts) snapshot() Counters {
	return Counters{
		Sent:       c[cSent],
		Delivered:  c[cDelivered],
		Dropped:    c[cDropped],
		Unroutable: c[cUnroutable],
		Overflow:   c[cOverflow],
		Duplicated: c[cDuplicated],
		Reordered:  c[cReordered],
		Delayed:    c[cDelayed],
		Coalesced:  c[cCoalesced],
		Injected:   c[cInjected],

		Steered:      c[cSteered],
		Mispredicted: c[cMispredicted],
		Malformed:    c[cMalformed],
	}
}

// pair is a direction between two addresses.
type pair struct{ from, to netip.AddrPort }

// Network is an in-memory network of Links. All its methods are safe for
// concurrent use.
type Network struct {
	cfg    Config // defaults filled in; read-only
	clock  link.Clock
	manual *ManualClock // cfg.Clock; nil in real time

	// mu guards the fields below and the Link fields documented as guarded
	// by the network's mu. Lock order: Link.rxMu, then mu. mu is never held
	// while calling a Receiver or the clock (the filter runs under it).
	mu       sync.Mutex
	rng      *rand.Rand
	links    map[netip.AddrPort]*Link // open links by address
	order    []*Link                  // open links in creation order: delivery order of Flush
	nextPort uint16
	seq      uint64             // packets enqueued so far
	inOrder  map[pair]time.Time // due time of each pair's latest in-order packet
	filter   Filter
	cuts     map[pair]bool // directions cut by Partition
	isolated map[netip.AddrPort]bool
	counts   counts
	closed   bool

	// delivering counts batches taken off a queue and not yet finished
	// (handed to their Receiver, which may be answering them); settled is
	// broadcast when it drops to zero.
	delivering int
	settled    sync.Cond // L is &mu
}

// NewNetwork returns an empty network.
func NewNetwork(cfg Config) *Network {
	if cfg.MaxDatagram <= 0 {
		cfg.MaxDatagram = DefaultMaxDatagram
	}
	if cfg.QueueLimit <= 0 {
		cfg.QueueLimit = DefaultQueueLimit
	}
	if cfg.ReorderDelay <= 0 {
		cfg.ReorderDelay = DefaultReorderDelay
	}
	n := &Network{
		cfg:      cfg,
		clock:    link.SystemClock{},
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		links:    make(map[netip.AddrPort]*Link),
		nextPort: firstPort,
		inOrder:  make(map[pair]time.Time),
		cuts:     make(map[pair]bool),
		isolated: make(map[netip.AddrPort]bool),
	}
	n.settled.L = &n.mu
	if cfg.Clock != nil {
		n.manual = cfg.Clock
		n.clock = cfg.Clock
		cfg.Clock.Attach(clockSource{n})
	}
	return n
}

// Clock returns the clock the network runs on, which the engines attached
// to its links should use: Config.Clock, or link.SystemClock.
func (n *Network) Clock() link.Clock { return n.clock }

// NewLink returns a link at a fresh address 127.0.0.1:port; addresses are
// handed out in order, so they are the same from run to run. It panics if
// the network is closed.
func (n *Network) NewLink() *Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	for {
		addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), n.nextPort)
		n.nextPort++
		if n.nextPort == 0 {
			n.nextPort = firstPort
		}
		if _, used := n.links[addr]; !used {
			return n.newLinkLocked(addr)
		}
	}
}

// NewLinkAt returns a link at addr, which may be the address of a closed
// link (a device restarting). It fails if addr is invalid or in use, and
// panics if the network is closed.
func (n *Network) NewLinkAt(addr netip.AddrPort) (*Link, error) {
	if !addr.IsValid() {
		return nil, fmt.Errorf("softnictest: invalid address %v", addr)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, used := n.links[addr]; used {
		return nil, fmt.Errorf("softnictest: address %v in use", addr)
	}
	return n.newLinkLocked(addr), nil
}

func (n *Network) newLinkLocked(addr netip.AddrPort) *Link {
	if n.closed {
		panic("softnictest: NewLink on a closed network")
	}
	l := &Link{
		net:  n,
		addr: addr,
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	n.links[addr] = l
	n.order = append(n.order, l)
	return l
}

// removeLocked forgets the open link l.
func (n *Network) removeLocked(l *Link) {
	if n.links[l.addr] == l {
		delete(n.links, l.addr)
	}
	n.order = slices.DeleteFunc(n.order, func(m *Link) bool { return m == l })
}

// SetFilter installs f, replacing any previous filter; nil removes it.
func (n *Network) SetFilter(f Filter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.filter = f
}

// Partition cuts the network between a and b, in both directions, until
// Heal. Packets already in flight are still delivered.
func (n *Network) Partition(a, b netip.AddrPort) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cuts[pair{a, b}] = true
	n.cuts[pair{b, a}] = true
}

// Isolate cuts addr off from every other address, in both directions,
// until Heal.
func (n *Network) Isolate(addr netip.AddrPort) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.isolated[addr] = true
}

// Heal undoes every Partition and Isolate.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cuts)
	clear(n.isolated)
}

// Inject queues raw as a datagram from from (any address, open link or
// not) to the link at to, due now. It bypasses the filter, partitions and
// random faults, so a test can hand a receiver malformed packets; a raw
// longer than MaxDatagram is dropped and counted as Truncated by the
// receiving link. An unknown destination is dropped and counted.
func (n *Network) Inject(from, to netip.AddrPort, raw []byte) {
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.counts[cInjected]++
	dst := n.links[to]
	if dst == nil {
		n.incr(nil, cDropped)
		n.incr(nil, cUnroutable)
		return
	}
	dst.counts[cInjected]++
	if len(raw) > n.cfg.MaxDatagram {
		dst.stats.Truncated++
		n.incr(nil, cDropped)
		return
	}
	n.enqueueLocked(dst, nil, from, now, slices.Clone(raw))
}

// Counters returns the network-wide counters.
func (n *Network) Counters() Counters {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.counts.snapshot()
}

// Queued returns the number of packets waiting at open links.
func (n *Network) Queued() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := 0
	for _, l := range n.order {
		q += len(l.queue)
	}
	return q
}

// Flush delivers every packet due now, including packets sent by
// receivers during the flush if they are due now too, on the calling
// goroutine, visiting links in creation order; it returns the number of
// datagrams delivered. It does not move the clock or fire timers (with a
// manual clock, Advance(0) does both). Packets to links not yet started
// wait. Flush must not be called from a Receiver (that deadlocks).
//
// In real time, Flush delivers what is due when it is called, racing
// benignly with the links' goroutines.
func (n *Network) Flush() int {
	now := n.clock.Now()
	total := 0
	for {
		d := n.deliverDue(now)
		if d == 0 {
			return total
		}
		total += d
	}
}

// Close closes every link and detaches the network from its clock.
func (n *Network) Close() error {
	n.mu.Lock()
	n.closed = true
	links := slices.Clone(n.order)
	n.mu.Unlock()
	for _, l := range links {
		l.Close()
	}
	if n.manual != nil {
		n.manual.Detach(clockSource{n})
	}
	return nil
}

// incr counts one event of kind c, network-wide and for l if it is not
// nil. The caller holds n.mu.
func (n *Network) incr(l *Link, c counter) {
	n.counts[c]++
	if l != nil {
		l.counts[c]++
	}
}

// add counts k events of kind c, network-wide and for l. The caller holds
// n.mu.
func (n *Network) add(l *Link, c counter, k int) {
	n.counts[c] += uint64(k)
	l.counts[c] += uint64(k)
}

// chance draws a random event of probability p. It draws nothing when p
// is 0 or 1, so unused faults leave the random stream alone.
func (n *Network) chance(p float64) bool {
	switch {
	case p <= 0:
		return false
	case p >= 1:
		return true
	}
	return n.rng.Float64() < p
}

// jitter draws a random extra delay in [0, Jitter].
func (n *Network) jitter() time.Duration {
	if n.cfg.Jitter <= 0 {
		return 0
	}
	return time.Duration(n.rng.Int64N(int64(n.cfg.Jitter) + 1))
}

// cutLocked reports whether traffic from from to to is cut.
func (n *Network) cutLocked(from, to netip.AddrPort) bool {
	return n.isolated[from] || n.isolated[to] || n.cuts[pair{from, to}]
}

// inOrderLocked returns the due time of a packet from p.from to p.to that
// would be due at at and must not overtake earlier packets of the pair.
// If commit, later packets of the pair may not overtake it either.
func (n *Network) inOrderLocked(p pair, at time.Time, commit bool) time.Time {
	at = later(at, n.inOrder[p])
	if commit {
		n.inOrder[p] = at
	}
	return at
}

// routeLocked sends one datagram of src, sent at now, to to. data is the
// network's own copy.
func (n *Network) routeLocked(src *Link, to netip.AddrPort, data []byte, now time.Time) {
	from := src.addr
	n.incr(src, cSent)
	if n.cutLocked(from, to) {
		n.incr(src, cDropped)
		return
	}
	dst := n.links[to]
	if dst == nil {
		n.incr(src, cDropped)
		n.incr(src, cUnroutable)
		return
	}
	v := Pass
	if n.filter != nil {
		h, hl, err := wire.Parse(data)
		payload := data[hl:]
		if err != nil {
			h, payload = wire.Header{}, data
		}
		v = n.filter(from, to, h, payload)
	}
	p := pair{from, to}
	at := now.Add(n.cfg.Delay)
	switch v.kind {
	case kindDrop:
		n.incr(src, cDropped)
	case kindDup:
		at = n.inOrderLocked(p, at.Add(n.jitter()), true)
		n.incr(src, cDuplicated)
		n.enqueueLocked(dst, src, from, at, data)
		n.enqueueLocked(dst, src, from, at, slices.Clone(data))
	case kindDelay:
		at = n.inOrderLocked(p, at.Add(n.jitter()), false).Add(v.delay)
		n.incr(src, cDelayed)
		n.enqueueLocked(dst, src, from, at, data)
	default:
		if n.chance(n.cfg.Drop) {
			n.incr(src, cDropped)
			return
		}
		at = at.Add(n.jitter())
		if n.chance(n.cfg.Reorder) {
			at = n.inOrderLocked(p, at, false).Add(n.cfg.ReorderDelay)
			n.incr(src, cReordered)
		} else {
			at = n.inOrderLocked(p, at, true)
		}
		n.enqueueLocked(dst, src, from, at, data)
		if n.chance(n.cfg.Dup) {
			n.incr(src, cDuplicated)
			n.enqueueLocked(dst, src, from, at.Add(n.jitter()), slices.Clone(data))
		}
	}
}

// enqueueLocked queues data at dst, due at at, and wakes dst's goroutine.
func (n *Network) enqueueLocked(dst, src *Link, from netip.AddrPort, at time.Time, data []byte) {
	if len(dst.queue) >= n.cfg.QueueLimit {
		n.incr(src, cDropped)
		n.incr(src, cOverflow)
		return
	}
	n.seq++
	heap.Push(&dst.queue, &packet{
		at:   at,
		seq:  n.seq,
		from: from,
		src:  src,
		data: data,
		join: n.chance(n.cfg.Coalesce),
	})
	select {
	case dst.wake <- struct{}{}:
	default:
	}
}

// nextDue returns the earliest due time of a packet at a started link.
// It first waits until no batch is being delivered, so that a manual clock
// does not move while a Receiver handles a packet due now (an AutoFlush
// link's goroutine may have taken it off the queue): the Receiver's
// answers are sent, and its timers armed, at the instant the packet was
// due, however the goroutines are scheduled.
func (n *Network) nextDue() (at time.Time, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for n.delivering > 0 {
		n.settled.Wait()
	}
	for _, l := range n.order {
		if l.started && !l.rxStopped && len(l.queue) > 0 {
			due := later(l.queue[0].at, l.rxFree)
			if !ok || due.Before(at) {
				at, ok = due, true
			}
		}
	}
	return at, ok
}

// deliverDue delivers, link by link in creation order, the packets due at
// now, and returns how many it delivered.
func (n *Network) deliverDue(now time.Time) int {
	n.mu.Lock()
	links := slices.Clone(n.order)
	n.mu.Unlock()
	total := 0
	for _, l := range links {
		total += l.deliverDue(now)
	}
	return total
}

// popBatch removes from l's queue the next batch due at now: its first
// due packet and the due packets from the same source that join it. It
// returns an empty batch if l is closed, not started, or has nothing due.
func (n *Network) popBatch(l *Link, now time.Time, batch []*packet) ([]*packet, link.Receiver) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l.closed || !l.started || l.rxStopped || len(l.queue) == 0 || l.queue[0].at.After(now) || l.rxFree.After(now) {
		return batch, nil
	}
	first := heap.Pop(&l.queue).(*packet)
	batch = append(batch, first)
	seg, total := len(first.data), len(first.data)
	for len(batch) < MaxBatch && len(l.queue) > 0 {
		p := l.queue[0]
		size := len(p.data)
		if !p.join || p.from != first.from || p.at.After(now) ||
			size == 0 || size > seg || total+size > DefaultMaxDatagram {
			break
		}
		batch = append(batch, heap.Pop(&l.queue).(*packet))
		total += size
		if size < seg {
			break // a shorter segment ends a GRO batch
		}
	}
	if l.rxEvery > 0 {
		l.rxFree = later(l.rxFree, now).Add(time.Duration(len(batch)) * l.rxEvery)
	}
	n.delivering++
	return batch, l.recv
}

// finishBatch counts a delivered batch and what happened to it on the
// receive path.
func (n *Network) finishBatch(l *Link, batch []*packet, rx *rxCounts) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.delivering--; n.delivering == 0 {
		n.settled.Broadcast()
	}
	l.stats.RxSyscalls++
	for i, p := range batch {
		l.stats.RxDatagrams++
		l.stats.RxBytes += uint64(len(p.data))
		n.incr(l, cDelivered)
		if i > 0 {
			n.incr(l, cCoalesced)
		}
	}
	n.add(l, cSteered, rx.steered)
	n.add(l, cMispredicted, rx.mispredicted)
	n.add(l, cMalformed, rx.malformed)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
