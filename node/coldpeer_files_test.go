package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/internal/fusetest"
	"github.com/krfs/krfs/internal/leaktest"
)

// mountNode mounts n's files in a temporary directory.
func mountNode(t *testing.T, n *Node) string {
	t.Helper()
	return fusetest.Mount(t, n, fs.Options{Timeout: 5 * time.Second})
}

// statReadMem stats peers/<gid>/mem under dir, opens it and reads 8 bytes
// at 64: what a cold client of a peer does first.
func statReadMem(t *testing.T, dir string, gid uint32) (os.FileInfo, string) {
	t.Helper()
	path := filepath.Join(dir, "peers", fmt.Sprint(gid), "mem")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8)
	if n, err := f.ReadAt(buf, 64); n != 8 || err != nil {
		t.Fatalf("read: %d %v", n, err)
	}
	return st, string(buf)
}

// TestColdPeerFilesNoDirectoryRead: through the files, a cold peer's mem
// is looked up, stat'ed, opened and read with the meta lookup and the
// data READ alone, no directory READ: the peer's meta entry carries the
// region's key, length, mode and owner, which the peer republished when
// its mem was chmod'ed and chown'ed. An entry without the owner (a node of
// before) still works, with one directory READ for the stat.
func TestColdPeerFilesNoDirectoryRead(t *testing.T) {
	fusetest.Require(t)
	leaktest.Check(t)
	a := testNode(t) // the peer, with the meta service
	lr, err := a.LocalRegion("mem")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lr.WriteAt([]byte("coldpeer"), 64); err != nil {
		t.Fatal(err)
	}
	if err := lr.Chmod(0o640); err != nil {
		t.Fatal(err)
	}
	if err := lr.Chown(1234, 567); err != nil {
		t.Fatal(err)
	}
	client := func() *Node {
		c, err := startAt(t, Config{Meta: []netip.AddrPort{a.Device().Addr()}, ShmDir: t.TempDir(), MemSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	check := func(st os.FileInfo, got string) {
		t.Helper()
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Perm() != 0o640 || sys.Uid != 1234 || sys.Gid != 567 || st.Size() != 1<<20 || got != "coldpeer" {
			t.Fatalf("peer's mem: mode %v owner %d:%d size %d data %q; want 0640 1234:567 %d \"coldpeer\"",
				st.Mode(), sys.Uid, sys.Gid, st.Size(), got, 1<<20)
		}
	}

	b := client()
	st, got := statReadMem(t, mountNode(t, b), a.Self())
	check(st, got)
	if s := b.Core().Stats(); s.DirReads != 0 || s.DirHints == 0 || s.ConnectMisses != 1 {
		t.Fatalf("cold peer through the files: %d directory READs, %d hints, %d meta lookups; want 0, >0, 1",
			s.DirReads, s.DirHints, s.ConnectMisses)
	}

	// The peer's entry as a node that does not publish the owner would
	// leave it: the stat reads the directory, the rest stays the same.
	info := a.Core().Info()
	info.MemOwnerKnown, info.MemMode, info.MemUID, info.MemGID = false, 0, 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.agent.Update(ctx, info); err != nil {
		t.Fatal(err)
	}
	c := client()
	if e, err := c.meta.Lookup(ctx, a.Self()); err != nil || e.MemOwnerKnown || e.MemRKey == 0 {
		t.Fatalf("entry without owner: %+v %v", e, err)
	}
	st, got = statReadMem(t, mountNode(t, c), a.Self())
	check(st, got)
	if s := c.Core().Stats(); s.DirReads != 1 {
		t.Fatalf("cold peer with an entry without owner: %d directory READs, want 1", s.DirReads)
	}
}
