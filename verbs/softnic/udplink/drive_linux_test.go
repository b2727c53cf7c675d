//go:build linux

package udplink

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestTokenFromReceiveGoroutineDisarms: a driver that receives the token
// from the link's receive goroutine (here kicked out of its blocking
// recvmsg) holds it with the socket out of the goroutine's epoll set, so
// that its release adds the socket back and so reports a datagram that
// arrived meanwhile. The socket used to stay in the set: a datagram that
// arrived while the driver held the token woke the goroutine (which saw
// the token taken and went back to waiting), the driver returned without
// receiving it, and its release changed nothing in the set. Nobody was
// woken for that datagram until the next one arrived: across a veth, a
// READ request sat in the responder's socket for a whole ACK timeout
// (31 ms) until the requester's retransmission came in behind it.
func TestTokenFromReceiveGoroutineDisarms(t *testing.T) {
	checkGoroutines(t)
	l := openLink(t, Config{Addr: loopback})
	c := newCollector(1, 64, false)
	l.Start(c)

	// The receive goroutine starts in blocking mode, holding the token.
	deadline := time.Now().Add(time.Minute) // a hang guard
	for !l.bgInRecv.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the receive goroutine never blocked in recvmsg")
		}
		time.Sleep(time.Millisecond)
	}

	peer, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(l.LocalAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	x := hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, 5)

	calls := 0
	var armed bool
	ready := func() bool {
		calls++
		if calls < 3 {
			return false // before it holds the token: at Drive's start and after it registered
		}
		// The driver holds the token, handed over by the receive goroutine.
		l.tok.mu.Lock()
		armed = l.tok.armed
		l.tok.mu.Unlock()
		// A datagram arrives that this driver will not receive.
		before := l.Counters().RxSyscalls
		if _, err := peer.Write(x); err != nil {
			t.Error(err)
			return true
		}
		for {
			n, err := unix.IoctlGetInt(l.fd, unix.SIOCINQ)
			if err != nil {
				t.Error(err)
				return true
			}
			if n > 0 {
				break
			}
			time.Sleep(100 * time.Microsecond) // the datagram is on its way (loopback)
		}
		if armed {
			// Let the receive goroutine's epoll report it (and see the
			// token taken), as it did in the bug.
			waitCounters(t, l, func(s Counters) bool { return s.RxSyscalls > before })
		}
		return true // done without receiving it
	}
	if err := l.Drive(nil, nil, ready); err != nil {
		t.Fatalf("Drive: %v", err)
	}
	if calls < 3 {
		t.Fatalf("ready called %d times: the driver never held the token", calls)
	}
	if armed {
		t.Error("a driver held the token with the socket in the receive goroutine's epoll set")
	}
	// The datagram that arrived while the driver held the token is
	// delivered by the receive goroutine (the guard in wait is a hang
	// guard: with the bug it is never delivered).
	recs := c.wait(t, 1)
	if recs[0].psn != 5 {
		t.Fatalf("delivered psn %d, want 5", recs[0].psn)
	}
}
