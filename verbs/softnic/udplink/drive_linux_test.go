//go:build linux

package udplink

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestTokenFromReceiveGoroutineDisarms: a driver that receives the token
// from the link's receive goroutine (here kicked out of its blocking
// recvmsg) holds it with the socket out of the goroutine's epoll set, so
// that its release adds the socket back and so reports a datagram that
// arrived meanwhile. Were the socket to stay in the set, a datagram that
// arrived while the driver held the token would wake the goroutine (which
// sees the token taken and goes back to waiting), the driver would return
// without receiving it, and its release would change nothing in the set:
// nobody would be woken for that datagram until the next one arrived
// (across a veth, a READ request waiting in the responder's socket for a
// whole ACK timeout, 31 ms, until the requester's retransmission).
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

// driveOne has peer send the link a SEND with psn i and drives until the
// collector has i deliveries.
func driveOne(t *testing.T, l *Link, c *collector, peer *net.UDPConn, i int) {
	t.Helper()
	if _, err := peer.Write(hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, uint32(i))); err != nil {
		t.Fatal(err)
	}
	if err := l.Drive(nil, nil, func() bool { return c.n.Load() >= int64(i) }); err != nil {
		t.Fatalf("Drive %d: %v", i, err)
	}
}

// driveHeld is driveOne with the datagram sent only once the driver holds
// the token, so that the driver receives it (whatever the receive
// goroutine was doing) and leaves the socket lingering.
func driveHeld(t *testing.T, l *Link, c *collector, peer *net.UDPConn, i int) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- l.Drive(nil, nil, func() bool { return c.n.Load() >= int64(i) }) }()
	deadline := time.Now().Add(time.Minute) // a hang guard
	for {
		l.tok.mu.Lock()
		held := l.tok.holder == tokDriver
		l.tok.mu.Unlock()
		if held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the driver never took the token")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if _, err := peer.Write(hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, uint32(i))); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Drive %d: %v", i, err)
	}
}

func dialLink(t *testing.T, l *Link) *net.UDPConn {
	t.Helper()
	peer, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(l.LocalAddr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return peer
}

// TestLingerKeepsDriversOffEpoll: a driver that comes back before the
// linger lapses takes the token without moving the socket in or out of
// the receive goroutine's epoll set. Before lingering every Drive made
// two epoll_ctl calls, about 4 us of a 30 us READ across a veth. Out of
// the set means out of the kernel's epoll too (not an entry with no
// events, which every send and receive on the socket would still visit).
func TestLingerKeepsDriversOffEpoll(t *testing.T) {
	checkGoroutines(t)
	l := openLink(t, Config{Addr: loopback})
	l.linger = time.Hour // never lapses here: the count below is exact
	if !epollWatches(t, l.epfd, l.fd) {
		t.Fatal("a new link's socket is not in its epoll set")
	}
	c := newCollector(1, 64, false)
	l.Start(c)
	peer := dialLink(t, l)

	driveHeld(t, l, c, peer, 1)
	l.tok.mu.Lock()
	armed, lingering := l.tok.armed, l.tok.lingering
	l.tok.mu.Unlock()
	if armed || !lingering {
		t.Fatalf("after a Drive: armed %v, lingering %v; want the socket out of the set, lingering", armed, lingering)
	}
	if epollWatches(t, l.epfd, l.fd) {
		t.Fatal("the kernel's epoll still has an entry for the socket after a Drive took it out")
	}
	before := l.Counters()
	for i := 2; i <= 1000; i++ {
		driveOne(t, l, c, peer, i)
	}
	after := l.Counters()
	if d := after.EpollMoves - before.EpollMoves; d != 0 {
		t.Errorf("999 Drives made %d epoll_ctl calls, want 0", d)
	}
	if d := after.RxDatagrams - before.RxDatagrams; d != 999 {
		t.Errorf("received %d datagrams, want 999", d)
	}
}

// TestLingerLapses: once drivers stop coming, the receive goroutine puts
// the socket back in its set, which reports a datagram that arrived while
// it was out; nobody drives for it. A request that waited so (a peer
// waits on it) turns lingering off; a late response does not.
func TestLingerLapses(t *testing.T) {
	for _, tc := range []struct {
		op   wire.Opcode
		miss bool
	}{{wire.OpSend, true}, {wire.OpWrite, true}, {wire.OpReadResp, false}, {wire.OpAck, false}} {
		t.Run(tc.op.String(), func(t *testing.T) { lingerLapse(t, tc.op, tc.miss) })
	}
}

func lingerLapse(t *testing.T, op wire.Opcode, miss bool) {
	checkGoroutines(t)
	l := openLink(t, Config{Addr: loopback})
	l.linger = 20 * time.Millisecond
	c := newCollector(1, 64, false)
	l.Start(c)
	peer := dialLink(t, l)

	// Until the datagram arrives with the socket out of the set: the
	// linger may lapse before this goroutine looks (a busy machine).
	for i := 1; ; i += 2 {
		if i > 200 {
			t.Fatal("the socket was always back in the set right after a Drive")
		}
		driveHeld(t, l, c, peer, i)
		pkt := hdr(op, wire.FlagFirst|wire.FlagLast, uint32(i+1))
		// Hold the token's lock so that the linger cannot lapse before
		// the datagram is queued. The datagram must find nobody
		// receiving: not the set (armed), and not the receive goroutine
		// blocked in recvmsg with the token (its blocking mode, which a
		// loaded machine can bring back before this goroutine looks).
		l.tok.mu.Lock()
		if l.tok.armed || l.tok.holder != tokFree {
			l.tok.mu.Unlock()
			driveOne(t, l, c, peer, i+1) // keep the psns in step
			continue
		}
		if _, err := peer.Write(pkt); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := unix.IoctlGetInt(l.fd, unix.SIOCINQ)
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			time.Sleep(100 * time.Microsecond) // on its way (loopback)
		}
		rearms := l.Counters().LingerRearms
		l.tok.mu.Unlock()
		recs := c.wait(t, i+1) // a hang guard: without the lapse nobody receives it
		if recs[i].psn != uint32(i+1) {
			t.Fatalf("delivered psn %d, want %d", recs[i].psn, i+1)
		}
		s := l.Counters()
		if s.LingerRearms == rearms {
			t.Errorf("delivered without a lapse: LingerRearms %d", s.LingerRearms)
		}
		want := uint64(0)
		if miss {
			want = 1
		}
		if s.LingerMisses != want {
			t.Errorf("LingerMisses %d, want %d", s.LingerMisses, want)
		}
		// After a miss a driver's release puts the socket back at once;
		// otherwise it lingers.
		driveHeld(t, l, c, peer, i+2)
		l.tok.mu.Lock()
		armed := l.tok.armed
		l.tok.mu.Unlock()
		if armed != miss {
			t.Errorf("after a Drive: socket in the set %v, want %v", armed, miss)
		}
		return
	}
}

// quietCollector is a collector that reports Quiet as told.
type quietCollector struct {
	*collector
	quiet atomic.Bool
}

func (q *quietCollector) Quiet() bool { return q.quiet.Load() }

// TestLingerOnlyWhenQuiet: the socket lingers after a driver leaves only
// while the receiver has nothing outstanding that a waiter who does not
// drive may wait for (link.Quiescer), and a waiter about to sleep without
// driving ends a linger (StopLinger): otherwise its completion would wait
// for the lapse. The cold connect of examples/race, whose meta lookup
// waits on a CQ's notification, took 1.8 ms instead of 0.4 without it.
func TestLingerOnlyWhenQuiet(t *testing.T) {
	checkGoroutines(t)
	l := openLink(t, Config{Addr: loopback})
	l.linger = time.Hour
	c := &quietCollector{collector: newCollector(1, 64, false)}
	l.Start(c)
	peer := dialLink(t, l)
	state := func() (armed bool, s Counters) {
		l.tok.mu.Lock()
		armed = l.tok.armed
		l.tok.mu.Unlock()
		return armed, l.Counters()
	}

	driveHeld(t, l, c.collector, peer, 1) // not quiet: no linger
	if armed, _ := state(); !armed {
		t.Fatal("a driver left the socket out of the set while the receiver was not quiet")
	}
	c.quiet.Store(true)
	driveHeld(t, l, c.collector, peer, 2) // quiet: lingers
	if armed, _ := state(); armed {
		t.Fatal("a driver put the socket back while the receiver was quiet")
	}
	l.StopLinger()
	armed, s := state()
	if !armed || s.LingerStops != 1 {
		t.Fatalf("after StopLinger: in the set %v, LingerStops %d; want true, 1", armed, s.LingerStops)
	}
	l.StopLinger() // not lingering: nothing to do
	if _, s := state(); s.LingerStops != 1 {
		t.Errorf("LingerStops %d after a second StopLinger, want 1", s.LingerStops)
	}
	// A datagram nobody drives for is delivered at once (a hang guard).
	if _, err := peer.Write(hdr(wire.OpSend, wire.FlagFirst|wire.FlagLast, 3)); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 3)
}

// TestDriverLooksAtDone: a driver blocked receiving with a done channel
// sees done close although nobody calls Wake (its wait is bounded by
// link.DonePoll), whether it waits with a prediction (holding RxLock),
// without one, or on the peek path of a receiver that does not predict.
// softnic relies on it to skip the wake-up registration for contexts
// whose deadline is far (cq.wakeOnDone).
func TestDriverLooksAtDone(t *testing.T) {
	for _, tc := range []struct {
		name string
		recv func() link.Receiver
	}{
		{"predicted", func() link.Receiver { return newPredictor(4, 64) }},
		{"nothing predicted", func() link.Receiver { p := newPredictor(4, 64); p.want.Store(1); return p }},
		{"peek", func() link.Receiver { return newCollector(1, 64, false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			l := openLink(t, Config{Addr: loopback})
			l.Start(tc.recv())
			done := make(chan struct{})
			errc := make(chan error, 1)
			go func() { errc <- l.Drive(done, nil, func() bool { return false }) }()
			deadline := time.Now().Add(time.Minute) // a hang guard
			for !l.inRecv.Load() {
				if time.Now().After(deadline) {
					t.Fatal("the driver never blocked receiving")
				}
				time.Sleep(100 * time.Microsecond)
			}
			before := l.Counters().RxTimeouts
			close(done) // no Wake
			select {
			case err := <-errc:
				if !errors.Is(err, link.ErrDone) {
					t.Fatalf("Drive = %v, want link.ErrDone", err)
				}
			case <-time.After(time.Minute): // a hang guard
				t.Fatal("the driver never looked at done")
			}
			if c := l.Counters(); c.RxTimeouts <= before {
				t.Errorf("RxTimeouts %d -> %d: the driver did not return by its bounded wait", before, c.RxTimeouts)
			}
		})
	}
}

// epollWatches reports whether the epoll instance epfd has an entry for fd
// (its "tfd:" lines in /proc/self/fdinfo).
func epollWatches(t *testing.T, epfd, fd int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", epfd))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var tfd int
		if _, err := fmt.Sscanf(line, "tfd: %d", &tfd); err == nil && tfd == fd {
			return true
		}
	}
	return false
}
