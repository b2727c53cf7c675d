package qpcore_test

import (
	"bytes"
	"errors"
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
	a := c.add(1, 0, qpcore.Config{})
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
