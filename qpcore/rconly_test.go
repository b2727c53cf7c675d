package qpcore_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
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
