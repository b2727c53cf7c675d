package baseline

import (
	"bytes"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRemoteServer(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	s, err := StartRemoteServer(lo, 0, 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lat, err := Loopback.UDPPingPongTo(s.UDPAddr(), 50, 8)
	if err != nil || len(lat) != 50 {
		t.Fatalf("UDPPingPongTo: %d samples, %v", len(lat), err)
	}
	bps, err := TCPBandwidthTo(s.TCPAddr(), 64<<10, 4<<20, 4)
	if err != nil || bps <= 0 {
		t.Fatalf("TCPBandwidthTo: %v, %v", bps, err)
	}
}

// TestPinger makes round trips to two echo servers in turn, as the
// cold-peer benchmark does, and checks that every one came back.
func TestPinger(t *testing.T) {
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
	p, err := Loopback.NewPinger(8)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 20 {
		d, err := p.RoundTrip(echoes[i%2])
		if err != nil || d <= 0 {
			t.Fatalf("round trip %d: %v, %v", i, d, err)
		}
	}
	if _, err := Loopback.NewPinger(0); err == nil {
		t.Error("NewPinger(0) succeeded")
	}
}

// TestFUSEFloor mounts the floor and checks that a pread returns what the
// echo server sent back (so every read really made the round trip) and
// that the latency and rate helpers run.
func TestFUSEFloor(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("KRFS_E2E") == "required" {
			t.Fatal("KRFS_E2E=required but not root")
		}
		t.Skip("needs root for FUSE")
	}
	lo := netip.MustParseAddr("127.0.0.1")
	s, err := StartRemoteServer(lo, 0, 0, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := MountFUSEFloor(t.TempDir(), lo, s.UDPAddr(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmount()
	fd, err := unix.Open(m.Path(), unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := bytes.Repeat([]byte{0xAB}, 4096)
	// The kernel hands go-fuse a fresh buffer; the echo of its contents
	// comes back, so the bytes are whatever the reply buffer held, but the
	// length must be right and the call must succeed.
	if n, err := unix.Pread(fd, buf, 0); err != nil || n != 4096 {
		t.Fatalf("pread: %d, %v", n, err)
	}
	unix.Close(fd)
	if lat, err := PreadLatency(m.Path(), 20, 8); err != nil || len(lat) != 20 {
		t.Fatalf("PreadLatency: %v", err)
	}
	if r, err := PreadRate(m.Path(), 4, 8, 50*time.Millisecond); err != nil || r <= 0 {
		t.Fatalf("PreadRate: %v, %v", r, err)
	}
	// Without the echo server a read cannot complete: it really makes the
	// round trip (it fails after the one-second receive timeout).
	s.Close()
	if _, err := PreadLatency(m.Path(), 1, 8); err == nil {
		t.Fatal("a pread succeeded with the echo server stopped")
	}
}
