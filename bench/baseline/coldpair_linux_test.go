package baseline

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestColdPair makes the meta-then-peer round trips against two echoes,
// and checks that a missing peer echo is an error naming it (the meta
// round trip alone is not a measurement).
func TestColdPair(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	var echoes []netip.AddrPort
	for range 2 {
		s, err := StartRemoteServer(lo, 0, 0, 1024)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		echoes = append(echoes, s.UDPAddr())
	}
	c, err := Loopback.NewColdPair(echoes[0], echoes[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 10 {
		if d, err := c.Once(); err != nil || d <= 0 {
			t.Fatalf("pair %d: %v, %v", i, d, err)
		}
	}

	// A port nobody serves: the peer's echo never answers.
	gone := netip.AddrPortFrom(lo, 9)
	c2, err := Loopback.NewColdPair(echoes[0], gone)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Once(); !errors.Is(err, ErrNoReply) || !strings.Contains(err.Error(), gone.String()) {
		t.Fatalf("Once to a silent peer: %v, want ErrNoReply naming %v", err, gone)
	}
	if _, err := Loopback.NewColdPair(netip.AddrPort{}, echoes[1]); err == nil {
		t.Error("NewColdPair without a meta echo succeeded")
	}
}
