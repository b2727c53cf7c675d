package qpcore_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed)
	}
	return b
}

// Messages of sizes around the zero-copy threshold arrive intact; below
// it they are copied through receive buffers, at and above it they are
// pulled straight into the receiver's buffer. Bytes copied per byte
// delivered: 2 on the small path, 0 on the large one.
func TestMessagesAroundThreshold(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, testMessagesAroundThreshold)
}

// receiverPair adds a receiver (gid 1, port 7 bound) and a sender (gid
// 2). No staging: every large message of these tests is for a reader that
// waits (or soon will), and must arrive zero-copy.
func receiverPair(t *testing.T, c *cluster) (a, b *tnode, port *qpcore.Port) {
	a = c.add(1, 0, qpcore.Config{MsgStageAfter: time.Hour})
	b = c.add(2, 0, qpcore.Config{})
	port, err := a.n.Bind(7)
	if err != nil {
		t.Fatal(err)
	}
	return a, b, port
}

func testMessagesAroundThreshold(t *testing.T, c *cluster) {
	const thr = qpcore.DefaultMsgThreshold
	a, b, port := receiverPair(t, c)
	ctx := ctxT(t, 20*time.Second)
	if _, err := a.n.Bind(7); !errors.Is(err, qpcore.ErrPortInUse) {
		t.Fatalf("second bind: %v", err)
	}
	sizes := []int{0, 1, 1000, thr - 1, thr, thr + 1, 3*thr + 17, 1 << 20}
	errc := make(chan error, 1)
	go func() {
		for i, n := range sizes {
			if err := b.n.Send(ctx, 1, 7, pattern(n, i)); err != nil {
				errc <- fmt.Errorf("send %d bytes: %w", n, err)
				return
			}
		}
		errc <- nil
	}()
	dst := make([]byte, 2<<20)
	for i, n := range sizes {
		m, err := port.Recv(ctx, dst)
		if err != nil {
			t.Fatalf("recv %d: %v", n, err)
		}
		if m.From != 2 || m.Len != n || m.ZeroCopy != (n >= thr) {
			t.Fatalf("message %d: %+v, want %d bytes from 2, zero copy %v", i, m, n, n >= thr)
		}
		if !bytes.Equal(dst[:n], pattern(n, i)) {
			t.Fatalf("message of %d bytes corrupted", n)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	sa, sb := a.n.Stats(), b.n.Stats()
	small, large := 0, 0
	for _, n := range sizes {
		if n < thr {
			small += n
		} else {
			large += n
		}
	}
	if sa.MsgSmallBytes != uint64(small) || sa.MsgLargeBytes != uint64(large) || sb.MsgRendezvous != 4 {
		t.Fatalf("delivered small %d large %d rendezvous %d, want %d %d 4", sa.MsgSmallBytes, sa.MsgLargeBytes, sb.MsgRendezvous, small, large)
	}
	copiedSmall := sa.MsgSmallCopied + sb.MsgSmallCopied
	t.Logf("small path: %d bytes delivered, %d copied (%.2f copies/byte); large path: %d bytes delivered, %d copied (%.2f copies/byte)",
		small, copiedSmall, float64(copiedSmall)/float64(small), large, sa.MsgLargeCopied+sb.MsgLargeCopied,
		float64(sa.MsgLargeCopied+sb.MsgLargeCopied)/float64(large))
	if copiedSmall != 2*uint64(small) || sa.MsgLargeCopied+sb.MsgLargeCopied != 0 {
		t.Fatalf("copy accounting: small %d large %d", copiedSmall, sa.MsgLargeCopied+sb.MsgLargeCopied)
	}
	// A message longer than the buffer stays queued.
	go b.n.Send(ctx, 1, 7, pattern(5000, 9))
	m, err := port.Recv(ctx, make([]byte, 100))
	if !errors.Is(err, qpcore.ErrShortBuffer) || !errors.Is(err, syscall.EMSGSIZE) || m.Len != 5000 {
		t.Fatalf("short buffer: %+v %v", m, err)
	}
	if m, err := port.Recv(ctx, dst); err != nil || m.Len != 5000 || !bytes.Equal(dst[:5000], pattern(5000, 9)) {
		t.Fatalf("after short buffer: %+v %v", m, err)
	}
	// Large message to an unbound port: the sender learns it.
	if err := b.n.Send(ctx, 1, 8, pattern(thr, 1)); !errors.Is(err, qpcore.ErrNoPort) {
		t.Fatalf("large send to an unbound port: %v", err)
	}
	port.Close()
	if _, err := port.Recv(ctx, dst); !errors.Is(err, qpcore.ErrClosed) {
		t.Fatalf("recv on a closed port: %v", err)
	}
	noQPErrors(t, a.n, b.n)
}

// TestRendezvousFromUnalignedBuffer: a large message whose buffer does
// not start on a page boundary (a sub-slice of the caller's memory) is
// exposed by an MR at a non-zero IOVA, as a NIC requires; the RTS
// carries that address and the receiver READs from it (a READ at
// address 0, a zero-based reading of the MR, misses).
func TestRendezvousFromUnalignedBuffer(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, func(t *testing.T, c *cluster) {
		const thr = qpcore.DefaultMsgThreshold
		a, b, port := receiverPair(t, c)
		defer port.Close()
		ctx := ctxT(t, 20*time.Second)
		for _, skew := range []int{100, 4000, 8} {
			mem := verbs.PageAligned(2*thr + 4096)
			msg := mem[skew : skew+thr+333]
			copy(msg, pattern(len(msg), skew))
			errc := make(chan error, 1)
			go func() { errc <- b.n.Send(ctx, 1, 7, msg) }()
			dst := make([]byte, len(msg))
			m, err := port.Recv(ctx, dst)
			if err != nil || m.Len != len(msg) || !m.ZeroCopy {
				t.Fatalf("message %d bytes into a page: %+v %v", skew, m, err)
			}
			if !bytes.Equal(dst, pattern(len(msg), skew)) {
				t.Fatalf("message %d bytes into a page corrupted", skew)
			}
			if err := <-errc; err != nil {
				t.Fatalf("send from %d bytes into a page: %v", skew, err)
			}
		}
		noQPErrors(t, a.n, b.n)
	})
}

// More messages than posted receive buffers: senders meet RNR NAKs and
// retry until the receiver reads; nothing is lost, per-sender order holds.
func TestMessagesRNR(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	// Time passes (a pump moves the clock) so that RNR back-offs end; the
	// message deadline is far beyond anything the test needs.
	cfg := qpcore.Config{MsgTimeout: time.Hour}
	a := c.add(1, 0, qpcore.Config{RecvBuffers: 4, MsgTimeout: time.Hour})
	senders := []*tnode{c.add(2, 0, cfg), c.add(3, 0, cfg)}
	defer c.pump(100 * time.Microsecond)()
	ctx := ctxT(t, 30*time.Second)
	port, err := a.n.Bind(1)
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	const each = 40
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for _, s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := s.n.Send(ctx, 1, 1, []byte(fmt.Sprintf("%d:%d", s.gid, i))); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	// Let the buffers run out before the first Recv.
	eventually(t, "an RNR retry", func() bool {
		return senders[0].n.Stats().RNRRetries+senders[1].n.Stats().RNRRetries > 0
	})
	next := map[uint32]int{}
	buf := make([]byte, 64)
	for range 2 * each {
		m, err := port.Recv(ctx, buf)
		if err != nil {
			t.Fatal(err)
		}
		var g, i int
		fmt.Sscanf(string(buf[:m.Len]), "%d:%d", &g, &i)
		if uint32(g) != m.From || i != next[m.From] {
			t.Fatalf("message %q from %d, want index %d", buf[:m.Len], m.From, next[m.From])
		}
		next[m.From]++
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	var rnr uint64
	for _, s := range senders {
		rnr += s.n.Stats().RNRRetries
	}
	t.Logf("%d messages through 4 receive buffers, %d RNR retries by qpcore", 2*each, rnr)
}
