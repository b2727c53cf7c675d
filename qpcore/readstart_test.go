package qpcore_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
)

// TestReadStart: READs started back to back complete in any order, each
// into its own buffer, and each is waited for once; a READ that fails the
// pre-check fails at its start and holds no slot.
func TestReadStart(t *testing.T) {
	checkLeaks(t)
	forEachFabric(t, func(t *testing.T, c *cluster) {
		a := c.add(1, 0, qpcore.Config{})
		b := c.add(2, 1<<20, qpcore.Config{})
		ctx := ctxT(t, 10*time.Second)
		for i := range b.mem[:64<<10] {
			b.mem[i] = byte(i * 7)
		}
		b.dev.SyncMemory()
		v := mustConnect(t, a.n, 2)
		const n = 12
		bufs := make([][]byte, n)
		ps := make([]*qpcore.PendingRead, n)
		for i := range ps {
			bufs[i] = make([]byte, 100+i*1000)
			p, err := v.ReadStart(ctx, bufs[i], "mem", uint64(i*3000))
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = p
		}
		// The last one first: its wait receives the others' responses too.
		for i := n - 1; i >= 0; i-- {
			if err := ps[i].Wait(ctx); err != nil {
				t.Fatalf("READ %d: %v", i, err)
			}
			if !ps[i].Ready() {
				t.Fatalf("READ %d not ready after Wait", i)
			}
			if err := ps[i].Wait(ctx); err != nil {
				t.Fatalf("second Wait of READ %d: %v", i, err)
			}
			want := b.mem[i*3000 : i*3000+len(bufs[i])]
			if !bytes.Equal(bufs[i], want) {
				t.Fatalf("READ %d: wrong bytes", i)
			}
		}
		if _, err := v.ReadStart(ctx, make([]byte, 8), "mem", 2<<20); err == nil {
			t.Fatal("a READ past the region's end started")
		}
		// Every slot is free again: a full depth of READs starts.
		for range 2 {
			var more []*qpcore.PendingRead
			for range qpcore.DefaultVQPDepth {
				p, err := v.ReadStart(ctx, make([]byte, 8), "mem", 0)
				if err != nil {
					t.Fatal(err)
				}
				more = append(more, p)
			}
			for _, p := range more {
				if err := p.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
