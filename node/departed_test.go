package node

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/fusetest"
)

// A peer that left the cluster (the meta service no longer lists it) stops
// resolving under peers/: stat, ls and info fail with ENOENT once the
// kernel's entry (1 s) is due for revalidation, though this node still
// holds the peer's metadata from before.
func TestDepartedPeerStopsResolving(t *testing.T) {
	fusetest.Require(t)
	m := testNode(t) // the meta service
	metaAddr := []netip.AddrPort{m.Device().Addr()}
	p, err := startAt(t, Config{Meta: metaAddr, ShmDir: t.TempDir(), MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	c, err := startAt(t, Config{Meta: metaAddr, ShmDir: t.TempDir(), MemSize: 4096})
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dir := mountNode(t, c)
	pdir := filepath.Join(dir, "peers", fmt.Sprint(p.Self()))
	if _, err := os.ReadFile(filepath.Join(pdir, "info")); err != nil {
		p.Close()
		t.Fatalf("info of a live peer: %v", err)
	}
	if _, err := os.ReadFile(filepath.Join(pdir, "mem")); err != nil {
		p.Close()
		t.Fatalf("mem of a live peer: %v", err)
	}
	p.Close() // deregisters
	// ls peers drops it at once.
	ents, err := os.ReadDir(filepath.Join(dir, "peers"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == fmt.Sprint(p.Self()) {
			t.Fatalf("ls peers still lists the departed peer")
		}
	}
	// Its names stop resolving once the kernel asks again (entry timeout
	// 1 s): polled, with a bound far above that.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, serr := os.Stat(pdir)
		_, ierr := os.ReadFile(filepath.Join(pdir, "info"))
		if errors.Is(serr, os.ErrNotExist) && errors.Is(ierr, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a departed peer still resolves: stat %v, info %v", serr, ierr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
