package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/fusetest"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs/softnic"
)

// A peer that restarts (same gid, same region store: its regions come back
// with their data under new keys) is read through the files at once: the
// first read of every region, not only the default one, succeeds, through
// a descriptor opened before the restart and through a new one.
func TestRestartedPeerRegionsReadAtOnce(t *testing.T) {
	fusetest.Require(t)
	m := testNode(t) // the meta service
	metaAddr := []netip.AddrPort{m.Device().Addr()}
	store := t.TempDir()
	listen := "127.0.0.1:0"
	start := func(gid uint32) *Node {
		dev, err := softnic.OpenUDP(listen)
		if err != nil {
			t.Fatal(err)
		}
		n, err := Start(context.Background(), Config{Device: dev, Meta: metaAddr, ShmDir: store, MemSize: 4096,
			QPCore: qpcore.Config{GID: gid, PeerTimeout: 2 * time.Second}}, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	p := start(0)
	listen = p.Device().Addr().String() // the restart keeps the address
	gid := p.Self()
	if _, err := p.Export("r", 8192, 0o644, 0, 0); err != nil {
		t.Fatal(err)
	}
	lr, err := p.LocalRegion("r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lr.WriteAt([]byte("region r"), 100); err != nil {
		t.Fatal(err)
	}
	c, err := startAt(t, Config{Meta: metaAddr, ShmDir: t.TempDir(), MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dir := mountNode(t, c)
	path := filepath.Join(dir, "peers", fmt.Sprint(gid), "mr", "r")
	read := func(f *os.File, what string) {
		t.Helper()
		buf := make([]byte, 8)
		if n, err := f.ReadAt(buf, 100); err != nil || string(buf[:n]) != "region r" {
			t.Fatalf("%s: %q %v", what, buf[:n], err)
		}
	}
	old, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	read(old, "before the restart")

	p.Close()
	p = start(gid)
	t.Cleanup(func() { p.Close() })

	// 8 threads open and read at once, as the first users of the
	// restarted peer.
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() {
			f, err := os.Open(path)
			if err != nil {
				errs <- fmt.Errorf("open: %w", err)
				return
			}
			defer f.Close()
			buf := make([]byte, 8)
			if n, err := f.ReadAt(buf, 100); err != nil || string(buf[:n]) != "region r" {
				errs <- fmt.Errorf("read %q: %w", buf[:n], err)
				return
			}
			errs <- nil
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Errorf("a first reader after the restart: %v", err)
		}
	}
	read(old, "first read after the restart, descriptor of before")
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open after the restart: %v", err)
	}
	defer f.Close()
	read(f, "first read after the restart, new descriptor")
}
