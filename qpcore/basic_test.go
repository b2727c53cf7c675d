package qpcore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
)

func TestOperations(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, testOperations)
}

func testOperations(t *testing.T, c *cluster) {
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 1<<20, qpcore.Config{})
	ctx := ctxT(t, 10*time.Second)
	v := mustConnect(t, a.n, 2)
	src := bytes.Repeat([]byte("krcore!"), 3000)
	if err := v.Write(ctx, src, "mem", 100); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	if err := v.Read(ctx, dst, "mem", 100); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("read after write differs")
	}
	b.dev.SyncMemory()
	if !bytes.Equal(b.mem[100:100+len(src)], src) {
		t.Fatal("write did not land")
	}
	if old, err := v.FetchAdd(ctx, "mem", 8, 5); err != nil || old != 0 {
		t.Fatalf("FetchAdd: %d %v", old, err)
	}
	if old, err := v.CompareAndSwap(ctx, "mem", 8, 5, 42); err != nil || old != 5 {
		t.Fatalf("CAS: %d %v", old, err)
	}
	if old, err := v.CompareAndSwap(ctx, "mem", 8, 5, 7); err != nil || old != 42 {
		t.Fatalf("failed CAS: %d %v", old, err)
	}
	b.dev.SyncMemory()
	if got := binary.NativeEndian.Uint64(b.mem[8:]); got != 42 {
		t.Fatalf("word %d", got)
	}
	// Asynchronous: a batch of writes then reads, one doorbell each.
	var wrs []qpcore.WR
	bufs := make([][]byte, 16)
	for i := range bufs {
		bufs[i] = bytes.Repeat([]byte{byte(i)}, 512)
		wrs = append(wrs, qpcore.WR{ID: uint64(i), Op: qpcore.OpWrite, Local: bufs[i], Region: "mem", Offset: uint64(4096 + i*512)})
	}
	if n, err := v.Post(ctx, wrs, 0); err != nil || n != len(wrs) {
		t.Fatalf("Post: %d %v", n, err)
	}
	got := make([]qpcore.Completion, 0, 16)
	cs := make([]qpcore.Completion, 8)
	for len(got) < 16 {
		if err := v.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		k := v.Poll(cs)
		got = append(got, cs[:k]...)
	}
	for i, c := range got {
		if c.ID != uint64(i) || c.Err != nil || c.Op != qpcore.OpWrite {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	rd := make([]byte, 16*512)
	if err := v.Read(ctx, rd, "mem", 4096); err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if rd[i*512] != byte(i) || rd[i*512+511] != byte(i) {
			t.Fatalf("batch write %d wrong", i)
		}
	}
	regs, err := v.Regions(ctx)
	if err != nil || len(regs) != 1 || regs[0].Name != "mem" || regs[0].Len != 1<<20 {
		t.Fatalf("regions %+v %v", regs, err)
	}
	noQPErrors(t, a.n, b.n)
	s := a.n.Stats()
	t.Logf("stats: ops dc %d rc %d doorbells %d dir reads %d", s.OpsDC, s.OpsRC, s.Doorbells, s.DirReads)
}

// A second Connect to a known peer costs no lookup and sends nothing; the
// first one costs exactly one lookup.
func TestConnectCosts(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{})
	c.add(2, 4096, peerCfg)
	ctx := ctxT(t, 5*time.Second)
	l0 := c.res.lookups.Load()
	v1 := mustConnect(t, a.n, 2)
	if got := c.res.lookups.Load() - l0; got != 1 {
		t.Fatalf("cold connect: %d lookups", got)
	}
	tx := a.dev.Stats().TxPackets
	for range 100 {
		v, err := a.n.Connect(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		v.Close()
	}
	if got := c.res.lookups.Load() - l0; got != 1 {
		t.Fatalf("warm connects looked up %d times", got-1)
	}
	if got := a.dev.Stats().TxPackets - tx; got != 0 {
		t.Fatalf("warm connects sent %d packets", got)
	}
	s := a.n.Stats()
	if s.ConnectMisses != 1 || s.ConnectHits != 100 || s.VQPsOpen != 1 {
		t.Fatalf("hits %d misses %d open %d", s.ConnectHits, s.ConnectMisses, s.VQPsOpen)
	}
	v1.Close()
	if err := v1.Close(); !errors.Is(err, qpcore.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if err := v1.Read(ctx, make([]byte, 8), "mem", 0); !errors.Is(err, qpcore.ErrClosed) {
		t.Fatalf("read on a closed VQP: %v", err)
	}
	// Forgotten, the peer costs a lookup again.
	if !a.n.Forget(2) {
		t.Fatal("Forget refused an idle peer")
	}
	mustConnect(t, a.n, 2)
	if got := c.res.lookups.Load() - l0; got != 2 {
		t.Fatalf("connect after Forget: %d lookups in all", got)
	}
	if st, ok := a.n.Peer(2); !ok || st.GID != 2 || st.Transport != qpcore.DC {
		t.Fatalf("Peer: %+v %v", st, ok)
	}
}

// Closing a node with operations in flight to a silent peer fails them
// with ErrClosed at once.
func TestCloseWithOperationsInFlight(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{PeerTimeout: 10 * time.Second})
	b := c.add(2, 4096, peerCfg)
	ctx := ctxT(t, 20*time.Second)
	v := mustConnect(t, a.n, 2)
	if err := v.Read(ctx, make([]byte, 8), "mem", 0); err != nil {
		t.Fatal(err)
	}
	b.close()
	errc := make(chan error, 4)
	for range 4 {
		go func() { errc <- v.Read(ctx, make([]byte, 8), "mem", 0) }()
	}
	// The reads are posted or about to be: either way Close fails them.
	// The clock does not move, so no timeout can be what ends them.
	settle()
	a.n.Close()
	for range 4 {
		if err := <-errc; !errors.Is(err, qpcore.ErrClosed) {
			t.Fatalf("in-flight read: %v", err)
		}
	}
	if _, err := a.n.Connect(ctx, 2); !errors.Is(err, qpcore.ErrClosed) {
		t.Fatalf("connect after close: %v", err)
	}
}
