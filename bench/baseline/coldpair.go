package baseline

import (
	"fmt"
	"net/netip"
	"time"
)

// ColdPair is the floor of reaching a peer this node has never reached
// (qpcore's cold Connect plus the first READ): one raw UDP round trip to
// an echo on the meta service's host (the meta lookup), then one to an
// echo on the peer's host (the READ), from one blocking socket. Used
// between the cold connects it is compared with, each echo's thread has
// slept since its last turn, as the meta service's and the peer's have:
// a round trip to a thread that just went idle costs about twice a warm
// one on a VM, so the floor is measured, not assumed.
type ColdPair struct {
	p          *Pinger
	meta, peer netip.AddrPort
}

// NewColdPair opens a ColdPair from h's address to the echoes (krfs-baseline
// serve, RemoteServer) at meta and peer.
func (h Host) NewColdPair(meta, peer netip.AddrPort) (*ColdPair, error) {
	if !meta.IsValid() || !peer.IsValid() {
		return nil, fmt.Errorf("baseline: NewColdPair: want two echo addresses, got %v and %v", meta, peer)
	}
	p, err := h.NewPinger(8)
	if err != nil {
		return nil, err
	}
	return &ColdPair{p: p, meta: meta, peer: peer}, nil
}

// Once makes the two round trips, meta's first, and returns the time from
// the first send to the second reply.
func (c *ColdPair) Once() (time.Duration, error) {
	t0 := time.Now()
	if _, err := c.p.RoundTrip(c.meta); err != nil {
		return 0, err
	}
	if _, err := c.p.RoundTrip(c.peer); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// Close closes the socket.
func (c *ColdPair) Close() { c.p.Close() }
