package qpcore_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
)

// TestDriveConcurrentCallers runs synchronous READs and WRITEs from many
// goroutines of a node that drives (the default: callers receive for the device
// while they wait, handing the receive token to each other) on real UDP
// sockets, and checks every byte: no caller stalls (each has a deadline),
// none gets another's data, and the node's asynchronous work (doorbell
// coalescing) keeps going.
func TestDriveConcurrentCallers(t *testing.T) {
	c := newClusterOn(t, "udp")
	a := c.add(1, 0, qpcore.Config{})
	b := c.add(2, 1<<16, qpcore.Config{})
	want := make([]byte, len(b.mem)) // the test never touches b.mem after SyncMemory
	for i := range want {
		want[i] = byte(i*13 + 1)
	}
	copy(b.mem, want)
	b.dev.SyncMemory()
	ctx := ctxT(t, 60*time.Second)
	v := mustConnect(t, a.n, 2)
	const workers, each = 12, 300
	runWorkers(t, workers, func(w int) error {
		got := make([]byte, 64)
		for k := range each {
			off := uint64((w*each + k) % 1000 * 64)
			if w%3 == 0 && k%4 == 0 {
				// Rewrite the same bytes: concurrent readers still
				// see the pattern.
				if err := v.Write(ctx, want[off:off+64:off+64], "mem", off); err != nil {
					return fmt.Errorf("worker %d write %d: %w", w, k, err)
				}
				continue
			}
			if err := v.Read(ctx, got, "mem", off); err != nil {
				return fmt.Errorf("worker %d read %d: %w", w, k, err)
			}
			if !bytes.Equal(got, want[off:off+64]) {
				return fmt.Errorf("worker %d read %d at %d: wrong bytes", w, k, off)
			}
		}
		return nil
	})
}
