package tests

import (
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
)

// TestFSOnMount runs Go's testing/fstest.TestFS, a client nobody here
// wrote, on a mounted node: directory listings agree with Stat and Open,
// ReadDir(n) pages, file contents read the same through every path, and
// mode bits and names are coherent.
//
// What it walks: peers/ (this node seen as a peer: mem, info, mr/, an
// empty ports/) and regions/ (its own regions). Left out: stats and
// stats.json, live counters re-rendered at every open like /proc files,
// so two reads can differ by design; and bound ports (none are bound
// here), whose reads wait for a message.
func TestFSOnMount(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	ns := privateNS(t, "fstest")
	mnt := t.TempDir()
	// A small region: fstest's iotest.TestReader reads it byte by byte at
	// many offsets, each a FUSE request and an RDMA READ.
	startNSMount(t, bin, ns, mnt, "--gid", "5", "--shm-dir", t.TempDir(), "--mem-size", "1K")
	if err := os.WriteFile(filepath.Join(mnt, "regions/mem"), []byte("fstest was here"), 0); err != nil {
		t.Fatal(err)
	}
	if err := fstest.TestFS(os.DirFS(filepath.Join(mnt, "peers")), "5/mem", "5/info", "5/mr/mem"); err != nil {
		t.Errorf("peers/: %v", err)
	}
	if err := fstest.TestFS(os.DirFS(filepath.Join(mnt, "regions")), "mem"); err != nil {
		t.Errorf("regions/: %v", err)
	}
}
