package qpcore_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
)

// peerCfg keeps the many peer nodes of a test small.
var peerCfg = qpcore.Config{DCIs: 2, RecvBuffers: 4, SendBuffers: 2}

// 1,000 VQPs over 8 DCIs issue mixed operations to 50 peers at once;
// every result is checked.
func TestThousandVQPsOverEightDCIs(t *testing.T) {
	checkLeaks(t)
	const (
		peers  = 50
		vqps   = 1000
		rounds = 6
		slot   = 256
	)
	c := newCluster(t)
	client := c.add(1, 0, qpcore.Config{DCIs: 8, RCCap: 8})
	for g := uint32(2); g < 2+peers; g++ {
		c.add(g, 64<<10, peerCfg)
	}
	ctx := ctxT(t, 60*time.Second)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, vqps)
	for i := range vqps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gid := uint32(2 + i%peers)
			v, err := client.n.Connect(ctx, gid)
			if err != nil {
				errs <- err
				return
			}
			defer v.Close()
			base := uint64(4096 + (i/peers)*slot) // this VQP's slot
			buf := make([]byte, slot)
			rd := make([]byte, slot)
			for r := range rounds {
				for k := range buf {
					buf[k] = byte(i + r*7 + k)
				}
				if err := v.Write(ctx, buf, "mem", base); err != nil {
					errs <- fmt.Errorf("vqp %d write: %w", i, err)
					return
				}
				if err := v.Read(ctx, rd, "mem", base); err != nil {
					errs <- fmt.Errorf("vqp %d read: %w", i, err)
					return
				}
				if !bytes.Equal(rd, buf) {
					errs <- fmt.Errorf("vqp %d round %d: read after write differs", i, r)
					return
				}
				if _, err := v.FetchAdd(ctx, "mem", 0, 1); err != nil {
					errs <- fmt.Errorf("vqp %d faa: %w", i, err)
					return
				}
				// CAS on the VQP's own word: r -> r+1 always succeeds.
				word := uint64(8 + (i/peers)*8)
				if old, err := v.CompareAndSwap(ctx, "mem", word, uint64(r), uint64(r+1)); err != nil || old != uint64(r) {
					errs <- fmt.Errorf("vqp %d cas: old %d err %v", i, old, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	elapsed := time.Since(start)
	for g := uint32(2); g < 2+peers; g++ {
		tn := c.nodes[g]
		tn.dev.SyncMemory()
		if got, want := binary.NativeEndian.Uint64(tn.mem[0:]), uint64(vqps/peers*rounds); got != want {
			t.Errorf("peer %d counter %d, want %d", g, got, want)
		}
		for k := range vqps / peers {
			if got := binary.NativeEndian.Uint64(tn.mem[8+k*8:]); got != rounds {
				t.Errorf("peer %d word %d = %d", g, k, got)
			}
		}
	}
	s := client.n.Stats()
	t.Logf("%d VQPs x %d rounds (4 ops) to %d peers in %v: %d ops on DC, %d on RC, %d doorbells, %d DCI waits, %d yields, %d RC QPs, %d fences",
		vqps, rounds, peers, elapsed, s.OpsDC, s.OpsRC, s.Doorbells, s.DCIWaits, s.DCIYields, s.RCConnects, s.Fences)
	noQPErrors(t, client.n)
	if s.DCIsFree != 8 || s.DCIWaiters != 0 {
		t.Errorf("pool not back to idle: %d free, %d waiting", s.DCIsFree, s.DCIWaiters)
	}
}
