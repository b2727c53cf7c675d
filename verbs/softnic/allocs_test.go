//go:build !race

package softnic_test

import (
	"context"
	"testing"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// TestReadAllocations: a synchronous 8-byte READ between two devices on
// real UDP allocates nothing in steady state, on either side (it made 4
// objects: a retransmission timer and its callback per READ, and two
// copies of the receive path's Interrupter). AllocsPerRun counts every
// goroutine's allocations, the receive goroutines' too; the average
// leaves room for the runtime's own rare ones. (Not under -race, which
// allocates for its own bookkeeping.)
func TestReadAllocations(t *testing.T) {
	defer softnic.NoDebugCheck()() // the test hook copies each header
	a, s, qa := benchPair(t)
	wcs := make([]verbs.WC, 1)
	wr := []verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: s.mr.RKey()}}
	ctx := context.Background()
	read := func() {
		if err := qa.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for a.cq.Poll(wcs[:1]) == 0 {
			if err := a.cq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := wcs[0].Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 {
		read() // warm up: buffers, pools, the QP's timer
	}
	if n := testing.AllocsPerRun(2000, read); n > 0.5 {
		t.Fatalf("an 8-byte READ allocates %.2f objects on average, want none", n)
	}
}
