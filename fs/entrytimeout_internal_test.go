package fs

import (
	"context"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// stubBackend knows one peer, 7, whose mem is 64 bytes, mode 0640; with
// down set, the peer does not answer. Methods the test does not reach are
// the embedded nil interface's (they would panic).
type stubBackend struct {
	Backend
	down     bool
	connects int
}

func (b *stubBackend) PeerInfo(ctx context.Context, gid uint32) (string, error) {
	if gid != 7 {
		return "", syscall.ENOENT
	}
	return "gid 7\n", nil
}

func (b *stubBackend) Connect(ctx context.Context, gid uint32) (Conn, error) {
	b.connects++
	if b.down {
		return nil, syscall.EHOSTDOWN
	}
	return stubConn{}, nil
}

type stubConn struct{ Conn }

func (stubConn) Regions(ctx context.Context) ([]Region, error) {
	return []Region{{Name: "mem", Size: 64, Mode: 0o640, Remote: true}}, nil
}
func (stubConn) Close() error { return nil }

// TestFixedNamesLongEntryTimeout: the names that cannot change meaning
// (the root's children, a peer's mem, mr, ports, info, a port of a peer)
// are answered with an entry timeout of fixedEntryTimeout and their
// attributes; a live
// peers/<gid> gets peerEntryTimeout; a fixed child whose attributes could
// not be had keeps the mount's short timeout (0 here: go-fuse fills it
// in), and no attribute timeout is lengthened.
func TestFixedNamesLongEntryTimeout(t *testing.T) {
	b := &stubBackend{}
	r := newRoot(b, Options{Timeout: time.Second})
	gofs.NewNodeFS(r, &gofs.Options{})
	ctx := context.Background()

	lookup := func(dir gofs.NodeLookuper, name string) (*gofs.Inode, *fuse.EntryOut) {
		t.Helper()
		var out fuse.EntryOut
		ch, e := dir.Lookup(ctx, name, &out)
		if e != 0 {
			t.Fatalf("lookup %s: %v", name, e)
		}
		if out.AttrTimeout() != 0 {
			t.Fatalf("lookup %s: attribute timeout %v, want the mount's", name, out.AttrTimeout())
		}
		return ch, &out
	}
	for _, name := range []string{"peers", "regions", "ports"} {
		if _, out := lookup(r, name); out.EntryTimeout() != fixedEntryTimeout {
			t.Fatalf("%s: entry timeout %v, want %v", name, out.EntryTimeout(), fixedEntryTimeout)
		}
	}
	var out fuse.EntryOut
	if _, e := r.Lookup(ctx, "nosuch", &out); e != syscall.ENOENT {
		t.Fatalf("lookup of an unknown root name: %v, want ENOENT", e)
	}

	peers, _ := lookup(r, "peers")
	peer, out7 := lookup(peers.Operations().(gofs.NodeLookuper), "7")
	if out7.EntryTimeout() != peerEntryTimeout {
		t.Fatalf("peers/7: entry timeout %v, want %v", out7.EntryTimeout(), peerEntryTimeout)
	}
	pd := peer.Operations().(gofs.NodeLookuper)
	mem, outMem := lookup(pd, "mem")
	if outMem.EntryTimeout() != fixedEntryTimeout || outMem.Attr.Size != 64 || outMem.Attr.Mode != syscall.S_IFREG|0o640 {
		t.Fatalf("peers/7/mem: entry timeout %v, size %d, mode %#o; want %v, 64, regular 0640",
			outMem.EntryTimeout(), outMem.Attr.Size, outMem.Attr.Mode, fixedEntryTimeout)
	}
	ports, _ := lookup(pd, "ports")
	if _, outPort := lookup(ports.Operations().(gofs.NodeLookuper), "100"); outPort.EntryTimeout() != fixedEntryTimeout ||
		outPort.Attr.Mode != syscall.S_IFREG|0o200 {
		t.Fatalf("peers/7/ports/100: entry timeout %v, mode %#o; want %v, regular 0200 (mem's write bits)",
			outPort.EntryTimeout(), outPort.Attr.Mode, fixedEntryTimeout)
	}
	b.down = true
	mem2, outDown := lookup(pd, "mem")
	if mem2 != mem || outDown.EntryTimeout() != 0 {
		t.Fatalf("peers/7/mem of a peer that does not answer: entry timeout %v (same inode %v), want the mount's",
			outDown.EntryTimeout(), mem2 == mem)
	}
	if b.connects != 3 {
		t.Fatalf("%d connects, want 3 (one per lookup of mem, one of the port)", b.connects)
	}
}
