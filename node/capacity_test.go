package node

import (
	"syscall"
	"testing"
)

// Capacity reports the region store's filesystem, which statfs (df) of
// the mount shows.
func TestCapacityIsTheStoresFilesystem(t *testing.T) {
	n := testNode(t)
	total, free, maxRegions, err := n.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.store.Dir(), &st); err != nil {
		t.Fatal(err)
	}
	if total != int64(st.Blocks)*st.Bsize || free <= 0 || free > total || maxRegions != n.maxRegions {
		t.Fatalf("Capacity = %d total, %d free, %d regions; the store's filesystem has %d bytes", total, free, maxRegions, int64(st.Blocks)*st.Bsize)
	}
}
