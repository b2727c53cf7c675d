package node

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/krfs/krfs/internal/fusetest"
)

// A region created on a peer is found under peers/<gid>/mr/ at once, also
// right after a lookup of the same name failed (the kernel keeps no
// negative entry there, and the daemon reads the peer's directory again
// for a name its copy lacks).
func TestPeerRegionCreatedFoundAtOnce(t *testing.T) {
	fusetest.Require(t)
	m := testNode(t) // the meta service
	metaAddr := []netip.AddrPort{m.Device().Addr()}
	p, err := startAt(t, Config{Meta: metaAddr, ShmDir: t.TempDir(), MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := startAt(t, Config{Meta: metaAddr, ShmDir: t.TempDir(), MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dir := mountNode(t, c)
	mr := filepath.Join(dir, "peers", fmt.Sprint(p.Self()), "mr")
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("late%d", i)
		path := filepath.Join(mr, name)
		if _, err := os.Stat(path); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("stat of %s before it exists: %v, want ENOENT", name, err)
		}
		if _, err := p.Export(name, 4096, 0o644, 0, 0); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			st, err := os.Stat(path)
			if err != nil || st.Size() != 4096 {
				t.Fatalf("stat of %s right after the peer created it: %v %v", name, st, err)
			}
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("open of %s right after the peer created it: %v", name, err)
		}
		buf := make([]byte, 8)
		if _, err := f.ReadAt(buf, 0); err != nil {
			t.Fatalf("read of %s right after the peer created it: %v", name, err)
		}
		f.Close()
	}
}
