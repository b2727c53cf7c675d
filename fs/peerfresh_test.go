package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/krfs/krfs/fs"
)

// setPeerRegion replaces (or, with data nil, removes) a peer's region, as
// the peer exporting it again under a new size would.
func (f *fakeBackend) setPeerRegion(gid uint32, name string, data []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if data == nil {
		delete(f.peers[gid], name)
		return
	}
	f.peers[gid][name] = &fakeRegion{info: fs.Region{Name: name, Size: int64(len(data)), Mode: 0o666, Remote: true}, data: data}
}

// TestPeerRegionChanges: an open descriptor of a peer's region follows
// the region as the peer grows, shrinks, removes and recreates it: reads
// past the old end see the new bytes, reads at or past the new end return
// 0, a read sized by the old length is retried once at the new one, a
// removed region is ENOENT and the same descriptor works again once the
// region is back. New regions show in mr/ at once.
func TestPeerRegionChanges(t *testing.T) {
	b := newFake(1)
	b.addPeer(7, 64)
	// The fake's out-of-bounds READ is EINVAL; a real peer's is EFBIG
	// (the pre-check) or EIO (a remote NAK): make it look like one.
	b.fault = func(write bool, p []byte, off int64, do func([]byte, int64) (int, error)) (int, error) {
		n, err := do(p, off)
		if errors.Is(err, syscall.EINVAL) {
			err = syscall.EIO
		}
		return n, err
	}
	b.setPeerRegion(7, "r", bytes.Repeat([]byte{'a'}, 16))
	dir := mountFake(t, b)
	path := filepath.Join(dir, "peers", "7", "mr", "r")
	fd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	buf := make([]byte, 16)
	if n, err := fd.ReadAt(buf, 0); n != 16 || err != nil {
		t.Fatalf("read: %d %v", n, err)
	}

	// Grown: bytes past the old end are read.
	b.setPeerRegion(7, "r", bytes.Repeat([]byte{'b'}, 64))
	if n, err := syscall.Pread(int(fd.Fd()), buf, 32); n != 16 || err != nil || buf[0] != 'b' {
		t.Fatalf("read past the old end after growth: %d %v %q", n, err, buf[:n])
	}

	// Shrunk: at the new end, 0; a read sized by the old length is
	// retried at the new one.
	b.setPeerRegion(7, "r", bytes.Repeat([]byte{'c'}, 8))
	if n, err := syscall.Pread(int(fd.Fd()), buf, 8); n != 0 || err != nil {
		t.Fatalf("read at the new end: %d %v, want 0 bytes", n, err)
	}
	b.setPeerRegion(7, "r", bytes.Repeat([]byte{'d'}, 8))
	if n, err := syscall.Pread(int(fd.Fd()), buf, 0); n != 8 || err != nil || buf[0] != 'd' {
		t.Fatalf("read of the old length after shrinking: %d %v", n, err)
	}

	// Removed: ENOENT, not EIO.
	b.setPeerRegion(7, "r", nil)
	if _, err := syscall.Pread(int(fd.Fd()), buf, 0); err != syscall.ENOENT {
		t.Fatalf("read of a removed region: %v, want ENOENT", err)
	}
	// Back (truncate to 0 and regrow): the descriptor works again.
	b.setPeerRegion(7, "r", bytes.Repeat([]byte{'e'}, 32))
	if n, err := syscall.Pwrite(int(fd.Fd()), []byte("xy"), 30); n != 2 || err != nil {
		t.Fatalf("write after the region came back: %d %v", n, err)
	}
	if n, err := syscall.Pread(int(fd.Fd()), buf, 16); n != 16 || err != nil || string(buf[14:]) != "xy" {
		t.Fatalf("read after the region came back: %d %v %q", n, err, buf[:n])
	}

	// A region created on the peer shows in mr/ at once, and opens.
	b.setPeerRegion(7, "fresh", make([]byte, 8))
	names, err := os.ReadDir(filepath.Join(dir, "peers", "7", "mr"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(names, func(e os.DirEntry) bool { return e.Name() == "fresh" }) {
		t.Fatalf("mr/ lists %v, without the new region", names)
	}
	if st, err := os.Stat(filepath.Join(dir, "peers", "7", "mr", "fresh")); err != nil || st.Size() != 8 {
		t.Fatalf("stat of the new region: %v %v", st, err)
	}
}

// TestPeersWhileMetaDown: with the meta service unreachable, ls peers
// shows the last known list and a known peer's files keep working.
func TestPeersWhileMetaDown(t *testing.T) {
	b := newFake(1)
	b.addPeer(7, 64)
	dir := mountFake(t, b)
	ls := func() []string {
		t.Helper()
		es, err := os.ReadDir(filepath.Join(dir, "peers"))
		if err != nil {
			t.Fatalf("ls peers: %v", err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	before := ls()
	b.mu.Lock()
	b.metaDown = true
	b.mu.Unlock()
	if after := ls(); !slices.Equal(before, after) {
		t.Fatalf("ls peers with the meta service down: %v, want the last list %v", after, before)
	}
	if err := os.WriteFile(filepath.Join(dir, "peers", "7", "mem"), []byte("hi"), 0); err != nil {
		t.Fatalf("write to a known peer with the meta service down: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "peers", "9")); !errors.Is(err, syscall.EHOSTDOWN) {
		t.Fatalf("stat of an unknown peer with the meta service down: %v, want EHOSTDOWN", err)
	}
}

// TestPeerRegionCreatedVisibleAtOnce: a name that a lookup under
// peers/<gid>/mr/ did not find is not remembered by the kernel (no
// negative entry): once the peer creates the region, the next stat and
// open of it succeed, without waiting for any timeout.
func TestPeerRegionCreatedVisibleAtOnce(t *testing.T) {
	b := newFake(1)
	b.addPeer(7, 64)
	dir := mountFake(t, b)
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("late%d", i)
		path := filepath.Join(dir, "peers", "7", "mr", name)
		if _, err := os.Stat(path); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("stat of %s before the region exists: %v, want ENOENT", name, err)
		}
		b.setPeerRegion(7, name, []byte("created"))
		var st os.FileInfo
		var err error
		if i%2 == 0 {
			st, err = os.Stat(path)
		} else {
			var f *os.File
			if f, err = os.Open(path); err == nil {
				st, err = f.Stat()
				f.Close()
			}
		}
		if err != nil || st.Size() != 7 {
			t.Fatalf("region %s created on the peer right after a failed lookup: %v %v, want it found at once", name, st, err)
		}
	}
}
