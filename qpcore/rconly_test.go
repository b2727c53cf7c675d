package qpcore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
)

// RC-only mode (Config.NoDC): a node on a device without DC transport.

// rcOnlyPairs are the (initiator, target) configurations where every
// operation must go over RC: both RC-only, or one of them.
var rcOnlyPairs = []struct {
	name     string
	from, to qpcore.Config
}{
	{"rconly-rconly", qpcore.Config{NoDC: true}, qpcore.Config{NoDC: true}},
	{"rconly-dc", qpcore.Config{NoDC: true}, qpcore.Config{}},
	// A DC node talking to an RC-only node must use RC even with its hot
	// peer promotion to RC disabled.
	{"dc-rconly", qpcore.Config{DisableRC: true}, qpcore.Config{NoDC: true}},
}

func TestRCOnlyOperations(t *testing.T) {
	checkLeaks(t)
	for _, pc := range rcOnlyPairs {
		t.Run(pc.name, func(t *testing.T) {
			forEachFabric(t, func(t *testing.T, c *cluster) { testRCOnlyOperations(t, c, pc.from, pc.to) })
		})
	}
}

func testRCOnlyOperations(t *testing.T, c *cluster, from, to qpcore.Config) {
	a := c.add(1, 1<<20, from)
	b := c.add(2, 1<<20, to)
	for _, tn := range []*tnode{a, b} {
		info := tn.n.Info()
		if noDC := tn.n.Config().NoDC; noDC != (info.DCTN == 0) || noDC != (info.DCKey == 0) {
			t.Fatalf("node %d (NoDC %v) publishes DCT %d key %#x", tn.gid, noDC, info.DCTN, info.DCKey)
		}
	}
	ctx := ctxT(t, 20*time.Second)
	v := mustConnect(t, a.n, 2)
	src := bytes.Repeat([]byte("rc-only"), 3000)
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
	b.dev.SyncMemory()
	if got := binary.NativeEndian.Uint64(b.mem[8:]); got != 42 {
		t.Fatalf("word %d, want 42", got)
	}
	// The other way round too (b's peer a is reached over RC as well).
	w := mustConnect(t, b.n, 1)
	if err := w.Write(ctx, src[:4096], "mem", 0); err != nil {
		t.Fatal(err)
	}
	a.dev.SyncMemory()
	if !bytes.Equal(a.mem[:4096], src[:4096]) {
		t.Fatal("write from b did not land")
	}

	// Messages both ways, small (bounce buffer) and large (rendezvous).
	const thr = qpcore.DefaultMsgThreshold
	sizes := []int{1, 1000, thr + 1, 1 << 20}
	for _, dir := range []struct {
		src, dst *tnode
		port     uint32
	}{{a, b, 7}, {b, a, 8}} {
		port, err := dir.dst.n.Bind(dir.port)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			for i, n := range sizes {
				if err := dir.src.n.Send(ctx, dir.dst.gid, dir.port, pattern(n, i)); err != nil {
					errc <- fmt.Errorf("send %d bytes: %w", n, err)
					return
				}
			}
			errc <- nil
		}()
		buf := make([]byte, 2<<20)
		for i, n := range sizes {
			m, err := port.Recv(ctx, buf)
			if err != nil {
				t.Fatalf("recv %d: %v", n, err)
			}
			if m.From != dir.src.gid || m.Len != n || !bytes.Equal(buf[:n], pattern(n, i)) {
				t.Fatalf("message %d: %+v, want %d bytes from %d", i, m, n, dir.src.gid)
			}
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}

	noQPErrors(t, a.n, b.n)
	for _, tn := range []*tnode{a, b} {
		s := tn.n.Stats()
		if s.OpsDC != 0 || s.DCIWaits != 0 || s.DCIsFree != 0 && tn.n.Config().NoDC {
			t.Errorf("node %d used DC: %d ops on DCIs, %d DCI waits, %d DCIs free", tn.gid, s.OpsDC, s.DCIWaits, s.DCIsFree)
		}
		if s.OpsRC == 0 || s.RCConnects != 1 {
			t.Errorf("node %d: %d RC ops, %d RC connections; want some and 1", tn.gid, s.OpsRC, s.RCConnects)
		}
	}
}

// More peers than RCCap: each new peer reclaims the least recently used
// idle RC QP, and every operation still lands where it should.
func TestRCOnlyMorePeersThanCap(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, testRCOnlyMorePeersThanCap)
}

func testRCOnlyMorePeersThanCap(t *testing.T, c *cluster) {
	const rcCap, peers, rounds = 2, 5, 3
	a := c.add(1, 0, qpcore.Config{NoDC: true, RCCap: rcCap})
	ctx := ctxT(t, 30*time.Second)
	var ts []*tnode
	var vs []*qpcore.VQP
	for i := range peers {
		gid := uint32(10 + i)
		cfg := qpcore.Config{}
		if i%2 == 0 {
			cfg.NoDC = true // a mix of RC-only and DC targets
		}
		ts = append(ts, c.add(gid, 64<<10, cfg))
		vs = append(vs, mustConnect(t, a.n, gid))
	}
	for r := range rounds {
		for i, v := range vs {
			src := pattern(4096, 100*r+i)
			off := uint64(r * 4096)
			if err := v.Write(ctx, src, "mem", off); err != nil {
				t.Fatalf("round %d peer %d: write: %v", r, ts[i].gid, err)
			}
			dst := make([]byte, len(src))
			if err := v.Read(ctx, dst, "mem", off); err != nil {
				t.Fatalf("round %d peer %d: read: %v", r, ts[i].gid, err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatalf("round %d peer %d: read differs from write", r, ts[i].gid)
			}
			if got, err := v.FetchAdd(ctx, "mem", 60<<10, 1); err != nil || got != uint64(r) {
				t.Fatalf("round %d peer %d: FetchAdd = %d, %v; want %d", r, ts[i].gid, got, err, r)
			}
			if s := a.n.Stats(); s.RCActive > rcCap {
				t.Fatalf("%d RC QPs active, cap %d", s.RCActive, rcCap)
			}
		}
	}
	for i, tn := range ts {
		tn.dev.SyncMemory()
		for r := range rounds {
			if !bytes.Equal(tn.mem[r*4096:(r+1)*4096], pattern(4096, 100*r+i)) {
				t.Errorf("peer %d: round %d's write not in memory", tn.gid, r)
			}
		}
	}
	s := a.n.Stats()
	// Round robin over more peers than slots: every operation to a new
	// peer found the pool full, so every connection but the first rcCap
	// reclaimed one.
	if want := uint64(peers*rounds - rcCap); s.RCConnects != uint64(peers*rounds) || s.RCEvictions != want {
		t.Errorf("%d RC connections, %d reclaimed; want %d and %d", s.RCConnects, s.RCEvictions, peers*rounds, want)
	}
	if s.OpsDC != 0 || s.DCIWaits != 0 || s.DCIsFree != 0 || s.RCConnectFailures != 0 {
		t.Errorf("stats: %+v", s)
	}
	noQPErrors(t, a.n)
}

// With the RC pool full of busy QPs, an operation to a new peer waits for
// one to turn idle, reclaims it and goes on.
func TestRCOnlyWaitsForSlot(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{NoDC: true, RCCap: 1})
	b := c.add(2, 4096, qpcore.Config{NoDC: true})
	d := c.add(3, 4096, qpcore.Config{})
	ctx := ctxT(t, 30*time.Second)
	vb, vd := mustConnect(t, a.n, 2), mustConnect(t, a.n, 3)
	if err := vb.Write(ctx, []byte("first"), "mem", 0); err != nil {
		t.Fatal(err)
	}
	// b's QP gets an operation stuck in flight behind a partition.
	aAddr, bAddr := netip.MustParseAddrPort(a.addr), netip.MustParseAddrPort(b.addr)
	c.net.Partition(aAddr, bAddr)
	if k, err := vb.Post(ctx, []qpcore.WR{{ID: 9, Op: qpcore.OpWrite, Local: []byte("second"), Region: "mem", Offset: 8}}, 0); err != nil || k != 1 {
		t.Fatalf("Post: %d %v", k, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- vd.Write(ctx, []byte("third"), "mem", 16) }()
	// Reaching the wait takes no clock time, only the CPU: advancing the
	// clock meanwhile would race a starved goroutine against b's timers.
	eventually(t, "the write to 3 waits for a slot", func() bool { return a.n.Stats().RCSlotWaits > 0 })
	select {
	case err := <-errc:
		t.Fatalf("write to 3 ended with the pool full: %v", err)
	default:
	}
	c.net.Heal()
	// The clock moves only while the write has not ended, paced by real
	// time (drive), so a starved goroutine does not see b's QP time out.
	if _, werr := c.drive(time.Millisecond, 500*time.Millisecond, func() error { return <-errc }); werr != nil {
		t.Fatalf("write to 3: %v", werr)
	}
	cs := make([]qpcore.Completion, 1)
	if k := vb.Poll(cs); k != 1 || cs[0].ID != 9 || cs[0].Err != nil {
		t.Fatalf("write to 2: %d completions %+v", k, cs[:k])
	}
	b.dev.SyncMemory()
	d.dev.SyncMemory()
	if string(b.mem[:14]) != "first\x00\x00\x00second" || string(d.mem[16:21]) != "third" {
		t.Fatalf("memory: %q, %q", b.mem[:14], d.mem[16:21])
	}
	if s := a.n.Stats(); s.RCEvictions != 1 || s.OpsDC != 0 || s.RCActive != 1 {
		t.Errorf("stats: %+v", s)
	}
	noQPErrors(t, a.n)
}

// An RC-only peer that cannot be connected fails the operation with
// ErrPeerUnreachable within PeerTimeout (of clock time), and the node
// reaches it once it answers again.
func TestRCOnlyConnectFails(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{NoDC: true})
	b := c.add(2, 4096, qpcore.Config{})
	ctx := ctxT(t, 30*time.Second)
	v := mustConnect(t, a.n, 2)
	c.net.Partition(netip.MustParseAddrPort(a.addr), netip.MustParseAddrPort(b.addr))
	took, err := c.drive(10*time.Millisecond, 10*time.Second, func() error {
		return v.Write(ctx, []byte("lost"), "mem", 0)
	})
	if !errors.Is(err, qpcore.ErrPeerUnreachable) {
		t.Fatalf("write across a partition: %v, want ErrPeerUnreachable", err)
	}
	if pt := a.n.Config().PeerTimeout; took > pt+100*time.Millisecond {
		t.Fatalf("failed after %v of clock time, PeerTimeout %v", took, pt)
	}
	if s := a.n.Stats(); s.RCConnectFailures != 1 || s.RCConnects != 0 || s.OpsDC != 0 {
		t.Fatalf("stats: %+v", s)
	}
	c.net.Heal()
	if _, err := c.drive(10*time.Millisecond, 10*time.Second, func() error {
		return v.Write(ctx, []byte("found"), "mem", 0)
	}); err != nil {
		t.Fatalf("write after the partition healed: %v", err)
	}
	b.dev.SyncMemory()
	if string(b.mem[:5]) != "found" {
		t.Fatalf("memory %q", b.mem[:5])
	}
}
