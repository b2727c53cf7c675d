package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
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

// restartLoopResult is what the readers of TestRestartedPeerReadersLoop
// saw: each open+pread's error (nil for a success), split by whether it
// started after the restarted peer's Start returned.
type restartLoopResult struct {
	during, after     map[string]int
	beforeOK, afterOK int
}

// TestRestartedPeerReadersLoop: 8 threads loop open+pread on a peer's
// region r (and one on its mem) while the peer restarts with the same
// store and gid. Every open+pread that starts once the restarted peer is
// up succeeds (the stale-region rule retries once after one re-lookup),
// also the first one of each thread.
func TestRestartedPeerReadersLoop(t *testing.T) {
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
	listen = p.Device().Addr().String()
	gid := p.Self()
	for _, name := range []string{"r", "s"} {
		if _, err := p.Export(name, 8192, 0o644, 0, 0); err != nil {
			t.Fatal(err)
		}
		lr, err := p.LocalRegion(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lr.WriteAt([]byte("region "+name), 100); err != nil {
			t.Fatal(err)
		}
	}
	mem, err := p.LocalRegion("mem")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.WriteAt([]byte("region m"), 100); err != nil {
		t.Fatal(err)
	}
	c, err := startAt(t, Config{Meta: metaAddr, ShmDir: t.TempDir(), MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dir := mountNode(t, c)
	peer := filepath.Join(dir, "peers", fmt.Sprint(gid))

	var phase atomic.Int32 // 0 before the restart, 1 during it, 2 after
	var stop atomic.Bool
	var mu sync.Mutex
	res := map[string]*restartLoopResult{}
	var wg sync.WaitGroup
	reader := func(rel, want string) {
		defer wg.Done()
		for !stop.Load() {
			ph := phase.Load()
			err := func() error {
				f, err := os.Open(filepath.Join(peer, rel))
				if err != nil {
					return fmt.Errorf("open: %w", err)
				}
				defer f.Close()
				buf := make([]byte, 8)
				n, err := f.ReadAt(buf, 100)
				if err != nil {
					return fmt.Errorf("pread: %w", err)
				}
				if string(buf[:n]) != want {
					return fmt.Errorf("pread: %q, want %q", buf[:n], want)
				}
				return nil
			}()
			if end := phase.Load(); end != ph && ph == 0 {
				ph = 1 // it overlapped the restart
			}
			mu.Lock()
			r := res[rel]
			switch {
			case ph == 0 && err == nil:
				r.beforeOK++
			case ph == 2 && err == nil:
				r.afterOK++
			case ph == 2:
				r.after[err.Error()]++
			case ph == 1 && err != nil:
				r.during[err.Error()]++
			}
			mu.Unlock()
			if ph == 0 && err != nil {
				t.Errorf("%s before the restart: %v", rel, err)
				return
			}
		}
	}
	for _, rel := range []string{"mem", "mr/r", "mr/s"} {
		res[rel] = &restartLoopResult{during: map[string]int{}, after: map[string]int{}}
	}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		rel := []string{"mr/r", "mr/s"}[i%2]
		go reader(rel, "region "+rel[len(rel)-1:])
	}
	wg.Add(1)
	go reader("mem", "region m")
	for warm := false; !warm; time.Sleep(time.Millisecond) { // every reader read once
		mu.Lock()
		warm = res["mem"].beforeOK > 0 && res["mr/r"].beforeOK >= 4 && res["mr/s"].beforeOK >= 4
		mu.Unlock()
	}

	phase.Store(1)
	p.Close()
	p = start(gid)
	t.Cleanup(func() { p.Close() })
	phase.Store(2)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		done := res["mr/r"].afterOK+len(res["mr/r"].after) >= 50 && res["mr/s"].afterOK+len(res["mr/s"].after) >= 50
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	for rel, r := range res {
		t.Logf("%s: during the restart %v; after it %d successes, failures %v", rel, r.during, r.afterOK, r.after)
		if len(r.after) > 0 {
			t.Errorf("%s: failures once the peer was back: %v", rel, r.after)
		}
		if r.afterOK == 0 {
			t.Errorf("%s: no success after the restart", rel)
		}
	}
}

// A restarted node's new incarnation is published (registered with the
// meta service) with its whole directory: a peer that looks it up again
// at that moment, before Start has returned, finds every region the
// store kept, not an empty directory (ENOENT for r, which the kernel then
// remembered for a second).
func TestRestartedPeerRegisteredWithItsRegions(t *testing.T) {
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
	listen = p.Device().Addr().String()
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
	read := func(what string) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("%s: open: %v", what, err)
		}
		defer f.Close()
		buf := make([]byte, 8)
		if n, err := f.ReadAt(buf, 100); err != nil || string(buf[:n]) != "region r" {
			t.Fatalf("%s: %q %v", what, buf[:n], err)
		}
	}
	read("before the restart")

	p.Close()
	registered := false
	afterRegister = func() {
		registered = true
		read("right after the restarted peer registered")
	}
	t.Cleanup(func() { afterRegister = nil })
	p = start(gid)
	t.Cleanup(func() { p.Close() })
	if !registered {
		t.Fatal("the restarted node never registered")
	}
	read("after the restart")
}
