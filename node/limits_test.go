package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/qpcore"
)

// The region count limit is QPCore.MaxRegions: one region more fails with
// ENOSPC and a message that names the limit, and leaves no file behind.
func TestRegionLimitLeavesNothingBehind(t *testing.T) {
	leaktest.Check(t)
	dir := t.TempDir()
	n, err := startAt(t, Config{ShmDir: dir, MemSize: 4096, QPCore: qpcore.Config{MaxRegions: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for i := 1; i < 4; i++ { // mem is the first
		if _, err := n.Export(fmt.Sprintf("r%d", i), 4096, 0o600, 0, 0); err != nil {
			t.Fatalf("region %d: %v", i+1, err)
		}
	}
	_, err = n.Export("one-too-many", 4096, 0o600, 0, 0)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "--max-regions") {
		t.Fatalf("5th region: %v, want ENOSPC naming --max-regions", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "one-too-many")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused region left its file: %v", err)
	}
	// An empty region counts too, and is listed.
	if err := n.Unexport("r3"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Export("empty", 0, 0o600, 0, 0); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range n.Regions() {
		found = found || r.Name == "empty"
	}
	if !found {
		t.Fatalf("empty region not listed: %v", n.Regions())
	}
	if _, err := n.Export("again", 8, 0o600, 0, 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("past the limit with an empty region: %v", err)
	}
	// Sizes: MaxRegionSize, and bad names say what a name may be.
	if _, err := n.Export("r1", shm.MaxSize+1, 0, 0, 0); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := n.Export("bad name", 8, 0o600, 0, 0); !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "A-Za-z0-9") {
		t.Fatalf("bad name: %v", err)
	}
}

// Growing and shrinking a region keeps its contents up to the smaller
// size and re-registers it.
func TestResizeKeepsContents(t *testing.T) {
	leaktest.Check(t)
	n, err := startAt(t, Config{ShmDir: t.TempDir(), MemSize: 4096, MaxRegionSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Export("r", 2, 0o600, 0, 0); err != nil {
		t.Fatal(err)
	}
	lr, _ := n.LocalRegion("r")
	lr.WriteAt([]byte("hi"), 0)
	if r, err := n.Export("r", 100000, 0o600, 0, 0); err != nil || r.Size != 100000 {
		t.Fatalf("grow: %+v %v", r, err)
	}
	got := make([]byte, 2)
	if _, err := lr.ReadAt(got, 0); err != nil || string(got) != "hi" {
		t.Fatalf("after growth: %q %v", got, err)
	}
	if _, err := n.Export("r", 1<<20+1, 0o600, 0, 0); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("past MaxRegionSize: %v", err)
	}
	if r, err := n.Export("r", 0, 0o600, 0, 0); err != nil || r.Size != 0 {
		t.Fatalf("truncate to 0: %+v %v", r, err)
	}
	if lr.Info().Size != 0 {
		t.Fatalf("size after truncation: %d", lr.Info().Size)
	}
}

// One daemon per region directory: a second node on it fails at once and
// says why; a failed start removes the directory it made.
func TestOneNodePerStoreAndFailedStartCleansUp(t *testing.T) {
	leaktest.Check(t)
	dir := filepath.Join(t.TempDir(), "store")
	n, err := startAt(t, Config{ShmDir: dir, MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	_, err = startAt(t, Config{ShmDir: dir, MemSize: 4096})
	if !errors.Is(err, shm.ErrInUse) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second node on one store: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "mem")); err != nil {
		t.Fatalf("the first node's region after the second's refusal: %v", err)
	}

	// A start that fails (a default region the filesystem cannot hold)
	// leaves no directory behind.
	fresh := filepath.Join(t.TempDir(), "fresh")
	if _, err := startAt(t, Config{ShmDir: fresh, MemSize: 1 << 60}); err == nil {
		t.Fatal("started with a 1 EiB region")
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed start left %s: %v", fresh, err)
	}
	// CloseAndDiscard removes a store its start made.
	other := filepath.Join(t.TempDir(), "other")
	m, err := startAt(t, Config{ShmDir: other, MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	m.CloseAndDiscard()
	if _, err := os.Stat(other); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CloseAndDiscard left %s: %v", other, err)
	}
	if removed, err := Purge(dir); !errors.Is(err, shm.ErrInUse) || len(removed) != 0 {
		t.Fatalf("Purge of a live node's store: %v %v", removed, err)
	}
	n.Close()
	if removed, err := Purge(dir); err != nil || len(removed) != 1 {
		t.Fatalf("Purge after Close: %v %v", removed, err)
	}
}

// Two single-node clusters on one host (both gid 1048576) get different
// default region directories.
func TestSingleNodeDefaultStoresDoNotCollide(t *testing.T) {
	leaktest.Check(t)
	var dirs []string
	for range 2 {
		n, err := startAt(t, Config{MemSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, n.StoreDir())
		defer func() {
			d := n.StoreDir()
			n.Close()
			shm.Purge(d)
		}()
	}
	if dirs[0] == dirs[1] {
		t.Fatalf("two single-node clusters share %s", dirs[0])
	}
}
