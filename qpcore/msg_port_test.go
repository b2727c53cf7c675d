package qpcore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
)

// TryRecv never waits: an empty port gives ErrWouldBlock (EAGAIN), a
// queued message is returned as by Recv.
func TestTryRecvOnAnEmptyPortWouldBlock(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 0, qpcore.Config{})
	ctx := ctxT(t, 20*time.Second)
	port, err := a.n.Bind(3)
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	buf := make([]byte, 64)
	if _, err := port.TryRecv(ctx, buf); !errors.Is(err, qpcore.ErrWouldBlock) || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("TryRecv on an empty port: %v, want EAGAIN", err)
	}
	if err := b.n.Send(ctx, 1, 3, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	var m qpcore.Message
	eventually(t, "the message queued", func() bool {
		m, err = port.TryRecv(ctx, buf)
		return !errors.Is(err, qpcore.ErrWouldBlock)
	})
	if err != nil || string(buf[:m.Len]) != "hello" || m.From != 2 {
		t.Fatalf("TryRecv: %+v %q %v", m, buf[:m.Len], err)
	}
}

// A large (rendezvous) message whose sender gave up before anyone read
// the port does not poison the port: the reader skips it (counted as
// dropped) and gets the next message.
func TestWithdrawnRendezvousDoesNotPoisonThePort(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{MsgStageAfter: time.Hour}) // no staging
	b := c.add(2, 0, qpcore.Config{MsgTimeout: time.Second})
	ctx := ctxT(t, 20*time.Second)
	port, err := a.n.Bind(4)
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	big := pattern(qpcore.DefaultMsgThreshold*2, 1)
	took, err := c.drive(10*time.Millisecond, time.Minute, func() error { return b.n.Send(ctx, 1, 4, big) })
	if !errors.Is(err, qpcore.ErrTimeout) {
		t.Fatalf("unread rendezvous: %v after %v, want ErrTimeout", err, took)
	}
	if err := b.n.Send(ctx, 1, 4, []byte("next")); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(big))
	dropped := a.n.Stats().MsgDropped
	_, err = c.drive(10*time.Millisecond, time.Minute, func() error {
		m, err := port.Recv(ctx, dst)
		if err == nil && !bytes.Equal(dst[:m.Len], []byte("next")) {
			t.Errorf("got %d bytes, want \"next\"", m.Len)
		}
		return err
	})
	if err != nil {
		t.Fatalf("Recv after a withdrawn rendezvous: %v", err)
	}
	if got := a.n.Stats().MsgDropped; got != dropped+1 {
		t.Fatalf("MsgDropped %d -> %d, want one more", dropped, got)
	}
}

// Backpressure is per port: a port whose queue is full refuses further
// messages (the sender retries until its context ends, then gets
// ErrPortFull, EAGAIN) while messages to another port of the same node
// go through; a small message to an unbound port fails with ErrNoPort.
func TestFullPortDoesNotBlockOtherPorts(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{PortDepth: 2, RecvBuffers: 8})
	b := c.add(2, 0, qpcore.Config{})
	ctx := ctxT(t, 20*time.Second)
	full, err := a.n.Bind(5)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	other, err := a.n.Bind(6)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for i := range 2 {
		if err := b.n.Send(ctx, 1, 5, []byte{byte(i)}); err != nil {
			t.Fatalf("message %d to port 5: %v", i, err)
		}
	}
	// The third waits for room until its deadline (clock time).
	sctx, cancel := context.WithCancel(ctx)
	took, err := c.drive(5*time.Millisecond, time.Minute, func() error {
		errc := make(chan error, 1)
		go func() { errc <- b.n.Send(sctx, 1, 5, []byte{2}) }()
		// Meanwhile port 6 takes many more messages than port 5's depth,
		// more than there are receive buffers.
		for i := range 20 {
			if err := b.n.Send(ctx, 1, 6, []byte{byte(i)}); err != nil {
				cancel()
				<-errc
				return fmt.Errorf("message %d to port 6 while port 5 is full: %w", i, err)
			}
			m, err := other.Recv(ctx, make([]byte, 8))
			if err != nil || m.Len != 1 {
				cancel()
				<-errc
				return fmt.Errorf("recv port 6: %+v %v", m, err)
			}
		}
		if b.n.Stats().MsgFullRetries == 0 {
			// Not yet refused once: let the clock run until it was.
			for b.n.Stats().MsgFullRetries == 0 {
				settle()
			}
		}
		cancel()
		return <-errc
	})
	if !errors.Is(err, qpcore.ErrPortFull) || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("send to a full port: %v after %v, want ErrPortFull", err, took)
	}
	if a.n.Stats().MsgRefused == 0 {
		t.Fatal("the receiver refused nothing")
	}
	if q := full.Queued(); q != 2 {
		t.Fatalf("port 5 holds %d messages, want its depth 2", q)
	}
	// Reading makes room again: message 3 gets in once the reader reads.
	// The cancelled message 2 may get in first: its sender gave up while
	// its last attempt was on its way, and the receiver queues it if the
	// read made room by then. So the reader reads until message 3 is
	// there, while the clock runs for the sender's retries.
	if _, err := c.drive(5*time.Millisecond, time.Minute, func() error {
		errc := make(chan error, 1)
		go func() { errc <- b.n.Send(ctx, 1, 5, []byte{3}) }()
		buf := make([]byte, 8)
		for {
			m, err := full.Recv(ctx, buf)
			if err != nil {
				return fmt.Errorf("recv port 5: %w", err)
			}
			if m.Len == 1 && buf[0] == 3 {
				break
			}
		}
		return <-errc
	}); err != nil {
		t.Fatalf("send after the reader made room: %v", err)
	}
	if err := b.n.Send(ctx, 1, 99, []byte("lost?")); !errors.Is(err, qpcore.ErrNoPort) {
		t.Fatalf("small send to an unbound port: %v, want ErrNoPort", err)
	}
	noQPErrors(t, a.n, b.n)
}

// A large message nobody reads yet is staged by the receiver after
// MsgStageAfter: the sender's Send completes, and the reader that comes
// later gets the bytes by a copy (counted), in order with the rest.
func TestUnreadLargeMessageIsStaged(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 0, qpcore.Config{MsgTimeout: time.Second})
	ctx := ctxT(t, 20*time.Second)
	port, err := a.n.Bind(4)
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	big := pattern(qpcore.DefaultMsgThreshold*3, 2)
	took, err := c.drive(time.Millisecond, time.Minute, func() error { return b.n.Send(ctx, 1, 4, big) })
	if err != nil {
		t.Fatalf("large send with no reader: %v after %v", err, took)
	}
	if took >= time.Second {
		t.Fatalf("large send took %v of clock time, want about MsgStageAfter", took)
	}
	if err := b.n.Send(ctx, 1, 4, []byte("after")); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(big))
	m, err := port.Recv(ctx, dst)
	if err != nil || m.Len != len(big) || m.ZeroCopy || !bytes.Equal(dst[:m.Len], big) {
		t.Fatalf("staged message: %+v %v", m, err)
	}
	if m, err := port.Recv(ctx, dst); err != nil || string(dst[:m.Len]) != "after" {
		t.Fatalf("message after the staged one: %q %v", dst[:m.Len], err)
	}
	st := a.n.Stats()
	if st.MsgStaged != 1 || st.MsgLargeCopied != uint64(len(big)) {
		t.Fatalf("staged %d, large bytes copied %d; want 1 and %d", st.MsgStaged, st.MsgLargeCopied, len(big))
	}
}

// A node posts a few receive buffers until it binds a port, then all of
// RecvBuffers; messages use the new ones (more are queued unread than
// were posted before the Bind), and a port bound later adds none.
func TestReceiveBuffersGrowAtFirstBind(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{RecvBuffers: 24, PortDepth: 20})
	b := c.add(2, 0, qpcore.Config{})
	ctx := ctxT(t, 20*time.Second)
	before := a.n.Stats().MsgRecvBuffers
	if before < 1 || before >= 20 {
		t.Fatalf("%d receive buffers posted before any Bind, want a few", before)
	}
	if err := b.n.Send(ctx, 1, 7, []byte("x")); !errors.Is(err, qpcore.ErrNoPort) {
		t.Fatalf("send to an unbound port: %v, want ErrNoPort", err)
	}
	bind := func(num uint32) *qpcore.Port {
		t.Helper()
		pt, err := a.n.Bind(num)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pt.Close() })
		if got := a.n.Stats().MsgRecvBuffers; got != 24 {
			t.Fatalf("%d receive buffers posted after Bind(%d), want 24", got, num)
		}
		return pt
	}
	pt := bind(7)
	const unread = 20
	for i := range unread {
		if err := b.n.Send(ctx, 1, 7, []byte{byte(i)}); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if q := pt.Queued(); q != unread {
		t.Fatalf("port holds %d messages, want %d", q, unread)
	}
	for i := range unread {
		m := make([]byte, 8)
		got, err := pt.Recv(ctx, m)
		if err != nil || got.Len != 1 || m[0] != byte(i) {
			t.Fatalf("message %d: %+v %v % x", i, got, err, m[:1])
		}
	}
	bind(8) // a second port adds none
	noQPErrors(t, a.n, b.n)
}

// A message given back with Unrecv is the port's next message, counted
// in QueuedBytes, and wakes a reader already waiting; OnQueue's function
// is called for it as for a message received.
func TestUnrecvPutsTheMessageBackFirst(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 0, qpcore.Config{})
	ctx := ctxT(t, 20*time.Second)
	port, err := a.n.Bind(3)
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	for _, m := range []string{"one", "two!"} {
		if err := b.n.Send(ctx, 1, 3, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	m, err := port.Recv(ctx, buf)
	if err != nil || string(buf[:m.Len]) != "one" {
		t.Fatalf("Recv: %q %v", buf[:m.Len], err)
	}
	queued := make(chan struct{}, 4)
	port.OnQueue(func() { queued <- struct{}{} })
	port.Unrecv(m.From, buf[:m.Len])
	<-queued     // OnQueue tells of a message given back
	buf[0] = 'X' // Unrecv kept its own copy
	if q, qb := port.Queued(), port.QueuedBytes(); q != 2 || qb != 7 {
		t.Fatalf("after Unrecv: %d messages, %d bytes queued, want 2, 7", q, qb)
	}
	for _, want := range []string{"one", "two!"} {
		m, err := port.Recv(ctx, buf)
		if err != nil || string(buf[:m.Len]) != want {
			t.Fatalf("Recv: %q %v, want %q", buf[:m.Len], err, want)
		}
	}
	// A reader waiting on the empty port gets a message given back.
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 64)
		m, err := port.Recv(ctx, b)
		got <- fmt.Sprintf("%s %v", b[:m.Len], err)
	}()
	port.Unrecv(2, []byte("again"))
	if g := <-got; g != "again <nil>" {
		t.Fatalf("waiting reader: %q", g)
	}
	<-queued
	// and of a message received.
	if err := b.n.Send(ctx, 1, 3, []byte("new")); err != nil {
		t.Fatal(err)
	}
	<-queued
	port.OnQueue(nil)
	if m, err := port.Recv(ctx, buf); err != nil || string(buf[:m.Len]) != "new" {
		t.Fatalf("Recv: %q %v", buf[:m.Len], err)
	}
	if qb := port.QueuedBytes(); qb != 0 {
		t.Fatalf("%d bytes queued at the end", qb)
	}
}
