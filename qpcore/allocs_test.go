//go:build !race

package qpcore_test

import (
	"context"
	"testing"
)

// TestReadAllocations: a synchronous READ through a VQP between two nodes
// on real UDP allocates nothing in steady state (it made 3 objects: the
// op, its done channel and its driver's ready closure; a synchronous op is
// now recycled). AllocsPerRun counts every goroutine's allocations; the
// average leaves room for the runtime's own rare ones. (Not under -race,
// which allocates for its own bookkeeping.)
func TestReadAllocations(t *testing.T) {
	v, done := memPair(t)
	defer done()
	ctx := context.Background()
	buf := make([]byte, 64)
	read := func() {
		if err := v.Read(ctx, buf, "mem", 0); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 {
		read() // warm up: the op pool, the registration cache, buffers
	}
	if n := testing.AllocsPerRun(2000, read); n > 0.5 {
		t.Fatalf("a synchronous READ allocates %.2f objects on average, want none", n)
	}
}
