package qpcore_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
)

// TestCoalescing: concurrent synchronous READs of one peer (parallel
// preads of one file) share doorbells, return the right bytes, and a lone
// caller still posts at once; NoCoalesce turns it off.
func TestCoalescing(t *testing.T) {
	checkLeaks(t)
	for _, off := range []bool{false, true} {
		// Real UDP: on the fake network with AutoFlush a READ completes
		// before the next caller arrives, so there is nothing to coalesce.
		c := newClusterOn(t, "udp")
		a := c.add(1, 0, qpcore.Config{NoCoalesce: off, DisableRC: true})
		b := c.add(2, 1<<16, qpcore.Config{})
		for i := range b.mem {
			b.mem[i] = byte(i * 7)
		}
		b.dev.SyncMemory()
		ctx := ctxT(t, 20*time.Second)
		v := mustConnect(t, a.n, 2)
		// A lone caller is never held back.
		one := make([]byte, 64)
		before := a.n.Stats()
		if err := v.Read(ctx, one, "mem", 0); err != nil {
			t.Fatal(err)
		}
		if got := a.n.Stats().Coalesced - before.Coalesced; got != 0 {
			t.Fatalf("a lone READ waited to coalesce (%d)", got)
		}
		const workers, each = 16, 200
		// A driver keeps its P across its short system calls, so the Go
		// scheduler may run one worker's loop alone for a while, the
		// others runnable but not running: such an attempt shows no
		// concurrency to coalesce (about 2% of attempts on a 2-vCPU
		// machine). The property holds if an attempt of three batches.
		var ops, bells, coal uint64
		for attempt := 1; attempt <= 3; attempt++ {
			before = a.n.Stats()
			runWorkers(t, workers, func(w int) error {
				buf := make([]byte, 256)
				for i := range each {
					o := uint64((w*each+i)%200) * 256
					if err := v.Read(ctx, buf, "mem", o); err != nil {
						return err
					}
					if !bytes.Equal(buf, b.mem[o:o+256]) {
						return errBytes
					}
				}
				return nil
			})
			st := a.n.Stats()
			ops, bells, coal = st.OpsDC-before.OpsDC, st.Doorbells-before.Doorbells, st.Coalesced-before.Coalesced
			t.Logf("NoCoalesce=%v, attempt %d: %d READs in %d doorbells, %d coalesced", off, attempt, ops, bells, coal)
			if ops < workers*each {
				t.Fatalf("%d READs posted, want at least %d", ops, workers*each)
			}
			if off {
				if coal != 0 {
					t.Fatalf("NoCoalesce: %d operations coalesced", coal)
				}
				break
			}
			if coal > 0 && bells*2 <= ops {
				break
			}
		}
		if !off && (coal == 0 || bells*2 > ops) {
			t.Fatalf("%d concurrent READs took %d doorbells (%d coalesced) in each of 3 attempts: not batched", ops, bells, coal)
		}
		noQPErrors(t, a.n, b.n)
		v.Close()
		a.close()
		b.close()
	}
}

var errBytes = bytesError("READ returned wrong bytes")

type bytesError string

func (e bytesError) Error() string { return string(e) }

// runWorkers runs work(0..n-1) on n goroutines and fails t with the first
// error any returned, once all are done.
func runWorkers(t *testing.T, n int, work func(w int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(w); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
