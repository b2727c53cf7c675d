package softnictest

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// poison is written over receive scratch buffers after each delivery, so
// that a receiver that keeps hdr or payload past Deliver sees garbage.
const poison = 0xEE

// Link is one device's attachment to a Network. It implements link.Link.
type Link struct {
	net  *Network
	addr netip.AddrPort

	// Fields guarded by net.mu.
	recv    link.Receiver
	started bool
	closed  bool
	queue   pktQueue // packets waiting for delivery
	// rxStopped holds the queue (StopReceive).
	rxStopped bool
	// rxEvery paces delivery (SetRxRate): the next packet is delivered
	// no earlier than rxFree.
	rxEvery time.Duration
	rxFree  time.Time
	stats   link.Stats
	counts  counts

	// rxMu serializes deliveries to the link, whatever goroutine makes them
	// (the link's own, Flush, ManualClock.Advance): a batch is popped and
	// handed to the receiver under it, so batches reach the receiver one at
	// a time and in queue order. It guards the scratch fields below.
	rxMu    sync.Mutex
	batch   []*packet
	scratch [][]byte // per batch slot: the datagram as received
	dsts    [][]byte // per batch slot: the memory Steer returned, or nil

	wake chan struct{} // cap 1: packets were queued
	done chan struct{} // closed by Close
	wg   sync.WaitGroup
}

var _ link.Link = (*Link)(nil)

// LocalAddr returns the link's address.
func (l *Link) LocalAddr() netip.AddrPort { return l.addr }

// MaxDatagram returns Config.MaxDatagram.
func (l *Link) MaxDatagram() int { return l.net.cfg.MaxDatagram }

// MaxDatagramTo returns Config.MaxDatagram: the fake network has one MTU.
func (l *Link) MaxDatagramTo(netip.AddrPort) int { return l.net.cfg.MaxDatagram }

// Send copies pkts into the network, in order. A packet larger than
// MaxDatagram is not sent; Send goes on with the rest and returns an error
// wrapping syscall.EMSGSIZE. On a closed link it returns net.ErrClosed.
// Packets to addresses without an open link are dropped silently, as UDP
// does.
func (l *Link) Send(pkts []link.Packet) error {
	n := l.net
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if l.closed {
		l.stats.TxErrors++
		return net.ErrClosed
	}
	l.stats.TxSyscalls++
	var err error
	for i := range pkts {
		p := &pkts[i]
		size := p.Len()
		if size > n.cfg.MaxDatagram {
			l.stats.TxErrors++
			if err == nil {
				err = fmt.Errorf("softnictest: send %d-byte datagram to %v: %w", size, p.To, syscall.EMSGSIZE)
			}
			continue
		}
		data := make([]byte, size)
		copy(data[copy(data, p.Hdr):], p.Payload)
		l.stats.TxDatagrams++
		l.stats.TxBytes += uint64(size)
		n.routeLocked(l, p.To, data, now)
	}
	return err
}

// Start begins delivery to r. In real time, and with AutoFlush, it starts
// the link's delivery goroutine; with a plain manual clock, packets are
// delivered by ManualClock.Advance and Network.Flush on their callers'
// goroutines instead, so that runs are deterministic. It panics if called
// twice.
func (l *Link) Start(r link.Receiver) {
	n := l.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if l.started {
		panic("softnictest: Link.Start called twice")
	}
	l.started, l.recv = true, r
	if !l.closed && (n.manual == nil || n.cfg.AutoFlush) {
		l.wg.Add(1)
		go l.run()
	}
}

// Stats returns the link's counters. RxSyscalls counts delivered batches;
// TxSyscalls counts Send calls.
func (l *Link) Stats() link.Stats {
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	return l.stats
}

// Counters returns the network's counters for this link (see Counters).
func (l *Link) Counters() Counters {
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	return l.counts.snapshot()
}

// Close detaches the link from the network, dropping the packets queued
// at it, and waits until no delivery to it is in progress and its
// goroutine has exited. Its address becomes free for NewLinkAt. Close must
// not be called from the link's Receiver. Closing twice does nothing.
func (l *Link) Close() error {
	n := l.net
	n.mu.Lock()
	if l.closed {
		n.mu.Unlock()
		return nil
	}
	l.closed = true
	n.removeLocked(l)
	for _, p := range l.queue {
		n.incr(p.src, cDropped)
	}
	l.queue = nil
	close(l.done)
	n.mu.Unlock()

	l.wg.Wait()
	l.rxMu.Lock() // wait out a delivery by Flush or Advance
	//lint:ignore SA2001 the empty section is the wait
	l.rxMu.Unlock()
	return nil
}

// run is the link's delivery goroutine. In real time it sleeps until the
// first queued packet is due; with a manual clock (AutoFlush) it delivers
// what is due whenever packets are queued, and leaves later packets to
// Advance.
func (l *Link) run() {
	defer l.wg.Done()
	n := l.net
	// timer, while armed, fires at due. It is never Reset while it may be
	// pending: the runtime marks a pending timer that is Reset as modified,
	// and the next time that comes, walks every timer of the process (of
	// the synctest bubble) to re-sort them. A link woken for every queued
	// packet, say a paced one with a full queue, would pay that walk at
	// every delivery. So it keeps a timer that is due when it must be, and
	// otherwise drops it (Stop leaves it in the heap until its time, at
	// logarithmic cost) for a new one.
	var timer *time.Timer
	var due time.Time
	armed := false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		l.deliverDue(n.clock.Now())

		var tick <-chan time.Time
		if n.manual == nil {
			n.mu.Lock()
			var next time.Time
			pending := len(l.queue) > 0 && !l.rxStopped
			if pending {
				next = later(l.queue[0].at, l.rxFree)
			}
			n.mu.Unlock()
			switch {
			case pending && armed && next.Equal(due):
			case pending:
				if armed {
					timer.Stop()
				}
				if timer == nil || armed {
					timer = time.NewTimer(time.Until(next))
				} else {
					timer.Reset(time.Until(next)) // fired: not pending
				}
				due, armed = next, true
			case armed:
				timer.Stop()
				timer, armed = nil, false
			}
			if armed {
				tick = timer.C
			}
		}
		select {
		case <-l.wake:
		case <-tick:
			armed = false
		case <-l.done:
			return
		}
	}
}

// deliverDue delivers the link's packets due at now, batch by batch, and
// returns how many it delivered.
func (l *Link) deliverDue(now time.Time) int {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	total := 0
	for {
		batch, r := l.net.popBatch(l, now, l.batch[:0])
		l.batch = batch
		if len(batch) == 0 {
			return total
		}
		rx := l.deliverBatchLocked(r, batch)
		l.net.finishBatch(l, batch, &rx)
		total += len(batch)
		clear(batch)
	}
}

// rxCounts counts what happened to one batch on the receive path.
type rxCounts struct{ steered, mispredicted, malformed int }

// deliverBatchLocked hands one batch to r the way udplink receives a GRO
// datagram. Under RxLock: if the first packet's header parses, Steer for
// every packet i with that header, index i and the payload length that
// header predicts; then the kernel's copy, which puts the bytes past the
// predicted header length into the steered memory and everything into
// scratch; then Deliver for every packet with its real header. A steered
// packet whose real header length matches the prediction is delivered
// with the steered memory as payload; one that does not is delivered from
// scratch, its steered memory left holding misplaced bytes. A packet
// without a parsable header is delivered whole as hdr with a nil payload.
// The caller holds l.rxMu.
func (l *Link) deliverBatchLocked(r link.Receiver, batch []*packet) (rx rxCounts) {
	for len(l.scratch) < len(batch) {
		l.scratch = append(l.scratch, nil)
		l.dsts = append(l.dsts, nil)
	}
	from := batch[0].from
	for i, p := range batch {
		l.scratch[i] = append(l.scratch[i][:0], p.data...)
	}
	first := l.scratch[0]
	h, err := wire.HeaderLen(first)
	predict := err == nil && h <= len(first)

	r.RxLock()
	if predict {
		for i, p := range batch {
			if len(p.data) < h {
				continue // shorter than the predicted header: not steerable
			}
			size := len(p.data) - h
			dst := r.Steer(from, first[:h], i, size)
			if size > 0 && len(dst) == size {
				l.dsts[i] = dst
			}
		}
		for i, p := range batch {
			if l.dsts[i] != nil {
				copy(l.dsts[i], p.data[h:])
			}
		}
	}
	for i := range batch {
		b := l.scratch[i]
		if dst := l.dsts[i]; dst != nil {
			if hl, err := wire.HeaderLen(b); err == nil && hl == h {
				r.Deliver(from, b[:h], dst)
				rx.steered++
				continue
			}
			rx.mispredicted++
		}
		hl, err := wire.HeaderLen(b)
		if err != nil || hl > len(b) {
			r.Deliver(from, b, nil)
			rx.malformed++
			continue
		}
		r.Deliver(from, b[:hl], b[hl:])
	}
	r.RxUnlock()

	for i := range batch {
		fill(l.scratch[i])
		l.dsts[i] = nil
	}
	return rx
}

func fill(b []byte) {
	for i := range b {
		b[i] = poison
	}
}
