package softnic_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

// driveOps runs ops synchronous READs from workers goroutines over one
// shared send CQ, the way qpcore does: each worker posts on its own QP and
// waits with Drive; whoever polls a completion finishes its owner's
// operation (a flag and a wake channel) and calls Wake. Every READ's bytes
// are checked. It fails (instead of hanging) if the run stalls.
func driveOps(t *testing.T, workers, ops int) {
	fb := newFabric(t, "udp", faults{})
	srv := fb.node()
	cli := fb.node()
	cq := cli.cq.(verbs.DrivenCQ)
	for i := range srv.mem {
		srv.mem[i] = byte(i * 7)
	}
	srv.dev.SyncMemory()

	type waiter struct {
		done atomic.Bool
		wake chan struct{}
	}
	ws := make([]*waiter, workers)
	qps := make([]verbs.QP, workers)
	for i := range ws {
		ws[i] = &waiter{wake: make(chan struct{}, 1)}
		qps[i], _ = connect(t, cli, srv, 200*time.Millisecond)
	}
	var pollMu sync.Mutex
	wcs := make([]verbs.WC, 64)
	poll := func() {
		pollMu.Lock()
		defer pollMu.Unlock()
		for {
			n := cq.Poll(wcs)
			if n == 0 {
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Status != verbs.StatusSuccess {
					t.Errorf("WR %d: %v", wc.ID, wc.Status)
				}
				w := ws[wc.ID]
				w.done.Store(true)
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}
			cq.Wake()
		}
	}

	var next atomic.Int64
	var stalled atomic.Bool
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := ws[i]
			off := uint64(i) * 64
			for next.Add(1) <= int64(ops) && !stalled.Load() {
				w.done.Store(false)
				select {
				case <-w.wake:
				default:
				}
				src := (uint64(next.Load()) * 8) % (memSize / 2)
				post(t, qps[i], verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Flags: verbs.Signaled,
					Local: sge(cli, memSize/2+off, 8), RemoteAddr: src, RKey: srv.mr.RKey()})
				err := cq.Drive(context.Background(), w.wake, func() bool {
					if w.done.Load() {
						return true
					}
					poll()
					return w.done.Load()
				})
				if err != nil {
					t.Errorf("Drive: %v", err)
					return
				}
				got := cli.mem[memSize/2+off : memSize/2+off+8]
				for k := range got {
					if got[k] != byte((src+uint64(k))*7) {
						t.Errorf("worker %d: READ at %d brought wrong bytes", i, src)
						return
					}
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	// A stall is a hang, not a slow run: the limit only turns a hang into
	// a failure with a stack dump, so it is generous.
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		stalled.Store(true)
		t.Fatalf("stalled: %d of %d operations started", next.Load(), ops)
	}
}

// TestDriveConcurrentWaiters: many synchronous callers share one CQ and
// take turns receiving; none is ever left waiting for a completion that
// another thread delivered (a lost wakeup would hang the run).
func TestDriveConcurrentWaiters(t *testing.T) {
	checkLeaks(t)
	ops := 20000
	if os.Getenv("KRFS_LONG") != "" || !testing.Short() {
		ops = 100000
	}
	driveOps(t, 8, ops)
}

// TestDriveSingleCaller: one caller receives its own completions on its
// goroutine.
func TestDriveSingleCaller(t *testing.T) {
	checkLeaks(t)
	driveOps(t, 1, 2000)
}

// TestDriveWakeWhileReceiving: a caller blocked receiving, with no packet
// coming, returns once another goroutine makes its condition true and
// calls Wake.
func TestDriveWakeWhileReceiving(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "udp", faults{})
	n := fb.node()
	cq := n.cq.(verbs.DrivenCQ)
	for range 100 {
		var done atomic.Bool
		calls := make(chan struct{}, 1)
		res := make(chan error, 1)
		go func() {
			res <- cq.Drive(context.Background(), nil, func() bool {
				select {
				case calls <- struct{}{}:
				default:
				}
				return done.Load()
			})
		}()
		<-calls // it is driving (and soon blocked receiving)
		done.Store(true)
		cq.Wake()
		if err := <-res; err != nil {
			t.Fatal(err)
		}
	}
}

// TestDriveContextAndClose: a driver returns ctx.Err() when its context
// ends, and ErrClosed when the device closes under it.
func TestDriveContextAndClose(t *testing.T) {
	checkLeaks(t)
	fb := newFabric(t, "udp", faults{})
	n := fb.node()
	cq := n.cq.(verbs.DrivenCQ)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- cq.Drive(ctx, nil, func() bool { return false }) }()
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("Drive after cancel: %v, want context.Canceled", err)
	}
	go func() { res <- cq.Drive(context.Background(), nil, func() bool { return false }) }()
	n.dev.Close()
	if err := <-res; !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("Drive after Close: %v, want ErrClosed", err)
	}
}
