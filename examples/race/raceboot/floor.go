package main

import (
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
	"time"

	"github.com/krfs/krfs/bench/baseline"
)

// bootFloor is a bootstrap's floor: its round trips, one after another, in
// raw UDP from one blocking socket to echo servers (krfs-baseline serve)
// on the hosts that serve them: for each memory node, one to its host
// (the table header's READ), preceded, with cold, by one to the meta
// service's host (the node's meta lookup, which a daemon that never
// reached the node makes); then the lookup's three, to the host of the
// node the key lives on (two bucket READs, the key-value READ). echoes
// is -echo: the meta host's, then one per memory node in -nodes order.
func bootFloor(listen string, nodes int, key []byte, cold bool) (result, error) {
	r := result{Mode: "floor", Nodes: nodes}
	if cold {
		r.Mode = "floor-cold"
	}
	if len(echoes) != nodes+1 {
		return r, fmt.Errorf("-echo: want %d addresses (the meta host's, then one per node), got %d", nodes+1, len(echoes))
	}
	l, err := netip.ParseAddrPort(listen)
	if err != nil {
		return r, fmt.Errorf("-listen %q: %w", listen, err)
	}
	p, err := (baseline.Host{Addr: l.Addr()}).NewPinger(8)
	if err != nil {
		return r, err
	}
	defer p.Close()
	rt := func(to netip.AddrPort) error {
		_, err := p.RoundTrip(to)
		return err
	}
	start := time.Now()
	for i := range nodes {
		if cold {
			if err := rt(echoes[0]); err != nil {
				return r, err
			}
		}
		if err := rt(echoes[1+i]); err != nil {
			return r, err
		}
	}
	tConn := time.Now()
	// The node the key lives on, as locate picks it.
	host := echoes[1+int(crc32.ChecksumIEEE(key)%uint32(nodes))]
	for range 3 {
		if err := rt(host); err != nil {
			return r, err
		}
	}
	r.ConnectUs = us(tConn.Sub(start))
	r.found(tConn, make([]byte, 0), 3)
	r.BootstrapUs = us(r.valueAt.Sub(start))
	if r.BootstrapUs <= 0 {
		return r, errors.New("floor: no time measured")
	}
	return r, nil
}
