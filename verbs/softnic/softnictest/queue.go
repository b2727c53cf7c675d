package softnictest

import (
	"net/netip"
	"time"
)

// packet is a datagram in flight to one link.
type packet struct {
	at   time.Time      // when it is due at the receiver
	seq  uint64         // network-wide enqueue order; breaks ties in at
	from netip.AddrPort // source address as the receiver sees it
	src  *Link          // sending link, for counters; nil for injected packets
	data []byte         // header and payload, owned by the network
	// join lets the packet share a receive batch with the packet delivered
	// just before it (see Config.Coalesce).
	join bool
}

// before orders packets by delivery time, then by enqueue order.
func (p *packet) before(q *packet) bool {
	if !p.at.Equal(q.at) {
		return p.at.Before(q.at)
	}
	return p.seq < q.seq
}

// pktQueue is a min-heap of packets ordered by packet.before; it
// implements container/heap.Interface.
type pktQueue []*packet

func (q pktQueue) Len() int           { return len(q) }
func (q pktQueue) Less(i, j int) bool { return q[i].before(q[j]) }
func (q pktQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *pktQueue) Push(x any)        { *q = append(*q, x.(*packet)) }
func (q *pktQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return p
}
