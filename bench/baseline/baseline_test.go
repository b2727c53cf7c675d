package baseline

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/internal/leaktest"
)

// checkNoLeaks fails the test if it leaves goroutines behind or ends with
// more open file descriptors than it started with.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	leaktest.Check(t)
	f0 := openFDs(t)
	t.Cleanup(func() {
		if f := openFDs(t); f > f0 {
			t.Errorf("leak: file descriptors %d -> %d", f0, f)
		}
	})
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// checkLatencies checks that a baseline's latencies are plausible: all
// positive, below limit, and a consistent Summary.
func checkLatencies(t *testing.T, l Latencies, n int, limit time.Duration) Summary {
	t.Helper()
	if len(l) != n {
		t.Fatalf("got %d latencies, want %d", len(l), n)
	}
	for i, d := range l {
		if d <= 0 || d > limit {
			t.Fatalf("latency %d = %v, want in (0, %v]", i, d, limit)
		}
	}
	s := l.Summary()
	if s.N != n || s.Min <= 0 ||
		s.Min > s.Typical || s.Typical > s.Max ||
		s.Min > s.Avg || s.Avg > s.Max ||
		s.Typical > s.P99 || s.P99 > s.P999 || s.P999 > s.Max ||
		s.Stdev < 0 || s.Stdev > s.Max-s.Min {
		t.Errorf("inconsistent summary %+v", s)
	}
	return s
}

func TestUDPPingPong(t *testing.T) {
	checkNoLeaks(t)
	for _, size := range []int{1, 64, 4096, MaxUDPSize} {
		l, err := UDPPingPong(200, size)
		if err != nil {
			t.Fatalf("UDPPingPong(200, %d): %v", size, err)
		}
		s := checkLatencies(t, l, 200, time.Second)
		t.Logf("UDP ping-pong %6d B: %v", size, s)
	}
}

func TestEchoRate(t *testing.T) {
	checkNoLeaks(t)
	for _, out := range []int{1, 32, 256} {
		r, err := EchoRate(out, 64, 100*time.Millisecond)
		if err != nil {
			t.Fatalf("EchoRate(%d, 64, 100ms): %v", out, err)
		}
		// One reply per second would already be absurd; loopback does
		// tens of thousands.
		if r < 100 || r > 1e9 {
			t.Errorf("EchoRate(%d) = %.0f/s, implausible", out, r)
		}
		t.Logf("UDP echo rate, %3d outstanding: %.0f/s", out, r)
	}
}

func TestTCPBandwidth(t *testing.T) {
	checkNoLeaks(t)
	for _, depth := range []int{1, 4} {
		bw, err := Loopback.TCPBandwidth(1<<20, 32<<20, depth)
		if err != nil {
			t.Fatalf("TCPBandwidth(1 MiB, 32 MiB, depth %d): %v", depth, err)
		}
		if bw < 1e6 || bw > 1e12 {
			t.Errorf("TCPBandwidth depth %d = %.0f B/s, implausible", depth, bw)
		}
		t.Logf("TCP 1 MiB responses, depth %d: %.2f GB/s", depth, bw/1e9)
	}
	// A total smaller than one message still moves one whole message.
	if _, err := TCPBandwidth(4096, 1); err != nil {
		t.Errorf("TCPBandwidth(4096, 1): %v", err)
	}
}

func TestTCPConnectRoundTrip(t *testing.T) {
	checkNoLeaks(t)
	l, err := TCPConnectRoundTrip(50)
	if err != nil {
		t.Fatalf("TCPConnectRoundTrip(50): %v", err)
	}
	s := checkLatencies(t, l, 50, 5*time.Second)
	t.Logf("TCP connect+round trip: %v", s)
}

func TestIPv6Loopback(t *testing.T) {
	checkNoLeaks(t)
	h := Host{Addr: netip.IPv6Loopback()}
	l, err := h.UDPPingPong(20, 64)
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	checkLatencies(t, l, 20, time.Second)
	if _, err := h.EchoRate(8, 64, 20*time.Millisecond); err != nil {
		t.Errorf("EchoRate over ::1: %v", err)
	}
	if _, err := h.TCPConnectRoundTrip(5); err != nil {
		t.Errorf("TCPConnectRoundTrip over ::1: %v", err)
	}
}

func TestBadArguments(t *testing.T) {
	checkNoLeaks(t)
	for name, err := range map[string]error{
		"ping iters 0":      second(UDPPingPong(0, 64)),
		"ping size 0":       second(UDPPingPong(1, 0)),
		"ping size huge":    second(UDPPingPong(1, MaxUDPSize+1)),
		"echo outstanding":  second(EchoRate(0, 64, time.Millisecond)),
		"echo too many":     second(EchoRate(MaxOutstanding+1, 64, time.Millisecond)),
		"echo duration":     second(EchoRate(1, 64, 0)),
		"tcp size":          second(TCPBandwidth(0, 1)),
		"tcp total":         second(TCPBandwidth(1, 0)),
		"tcp depth":         second(Loopback.TCPBandwidth(1, 1, 0)),
		"connect iters":     second(TCPConnectRoundTrip(0)),
		"zoned address":     second(Host{Addr: netip.MustParseAddr("fe80::1%lo")}.UDPPingPong(1, 1)),
		"foreign address":   second(Host{Addr: netip.MustParseAddr("192.0.2.1")}.UDPPingPong(1, 1)),
		"foreign tcp":       second(Host{Addr: netip.MustParseAddr("192.0.2.1")}.TCPConnectRoundTrip(1)),
		"foreign tcp bytes": second(Host{Addr: netip.MustParseAddr("192.0.2.1")}.TCPBandwidth(1, 1, 1)),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func TestEchoServerStopsPromptly(t *testing.T) {
	checkNoLeaks(t)
	for _, batch := range []bool{false, true} {
		sock, err := openUDP(Loopback.Addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := startEcho(sock, 64, batch)
		time.Sleep(5 * time.Millisecond) // let it block in the kernel
		t0 := time.Now()
		if err := s.stop(); err != nil {
			t.Errorf("stop (batch %v): %v", batch, err)
		}
		// Well below the receive timeout: shutdown woke the receive.
		if d := time.Since(t0); d > udpTimeout/2 {
			t.Errorf("stop (batch %v) took %v", batch, d)
		}
		sock.close()
	}
}

func TestErrNoReplyWhenNobodyAnswers(t *testing.T) {
	checkNoLeaks(t)
	// A socket that nobody serves: the client must give up with ErrNoReply.
	dead, err := openUDP(Loopback.Addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.close()
	cli, err := openUDP(Loopback.Addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.close()
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds()) // not the default second
	if err := unix.SetsockoptTimeval(cli.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	if _, err := pingPong(cli, &dead.local, 1, 8); !errors.Is(err, ErrNoReply) {
		t.Errorf("pingPong to a silent socket: %v, want ErrNoReply", err)
	}
}

func TestAlternate(t *testing.T) {
	checkNoLeaks(t)
	var chunks []int
	base, err := Alternate(3, 10, 8, func(k int) error {
		chunks = append(chunks, k)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{4, 3, 3}; !slices.Equal(chunks, want) {
		t.Fatalf("chunks %v, want %v", chunks, want)
	}
	checkLatencies(t, base, 10, time.Minute)

	boom := errors.New("boom")
	calls := 0
	if _, err := Alternate(4, 8, 8, func(int) error {
		if calls++; calls == 2 {
			return boom
		}
		return nil
	}); !errors.Is(err, boom) || calls != 2 {
		t.Fatalf("error of the second chunk: %v after %d calls", err, calls)
	}
	for _, bad := range [][2]int{{0, 10}, {5, 4}} {
		if _, err := Alternate(bad[0], bad[1], 8, func(int) error { return nil }); err == nil {
			t.Errorf("Alternate(%d, %d) accepted", bad[0], bad[1])
		}
	}
}

// TestAlternateWithInterleaves checks that every chunk of ours is followed
// by a chunk of the baseline of the same size, that the baseline's
// latencies come back in order, and that a baseline's error stops the run.
func TestAlternateWithInterleaves(t *testing.T) {
	var trace []string
	n := 0
	base, err := AlternateWith(3, 7, func(k int) error {
		trace = append(trace, fmt.Sprintf("ours%d", k))
		return nil
	}, func(k int) (Latencies, error) {
		trace = append(trace, fmt.Sprintf("base%d", k))
		var l Latencies
		for range k {
			n++
			l = append(l, time.Duration(n))
		}
		return l, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ours3", "base3", "ours2", "base2", "ours2", "base2"}; !slices.Equal(trace, want) {
		t.Fatalf("order %v, want %v", trace, want)
	}
	for i, d := range base {
		if d != time.Duration(i+1) {
			t.Fatalf("baseline latencies %v, want 1..7 in order", base)
		}
	}
	boom := errors.New("boom")
	ours := 0
	if _, err := AlternateWith(4, 8, func(int) error { ours++; return nil }, func(int) (Latencies, error) { return nil, boom }); !errors.Is(err, boom) || ours != 1 {
		t.Fatalf("baseline error: %v after %d chunks of ours", err, ours)
	}
}

// TestRounds checks the chunking AlternateWith's callers use: chunks of
// ChunkOps operations with a remote server, of LocalChunkOps with the
// in-process echo, at least 10 rounds, never more rounds than operations.
func TestRounds(t *testing.T) {
	for _, c := range []struct{ n, remote, local int }{
		{1, 1, 1}, {5, 5, 5}, {10, 10, 10}, {300, 10, 10}, {2000, 10, 10}, {2200, 11, 10},
		{20000, 100, 10}, {22000, 110, 11}, {100000, 500, 50},
	} {
		if got := RemoteRounds(c.n); got != c.remote {
			t.Errorf("RemoteRounds(%d) = %d, want %d", c.n, got, c.remote)
		}
		if got := LocalRounds(c.n); got != c.local {
			t.Errorf("LocalRounds(%d) = %d, want %d", c.n, got, c.local)
		}
	}
}
