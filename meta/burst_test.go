package meta

import (
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// TestColdLookupBurstSlowServer: many clients look up many cold gids at
// once while the meta server is slow to answer (every packet it sends is
// late by serverStall, as when a loaded machine does not schedule its
// process: tens of milliseconds, more than a NIC's default ACK timeout
// budget of 8 x 8 ms). Every lookup succeeds and no client reconnects:
// a slow server is not a dead one. Time is a manual clock shared by the
// network, the devices and the clients, so the stall is exact whatever
// the machine's load.
func TestColdLookupBurstSlowServer(t *testing.T) {
	checkLeaks(t)
	const (
		clients     = 8
		gids        = 24
		serverStall = 150 * time.Millisecond
	)
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	ctx := ctxT(t)
	sdev := f.device()
	srv := startServer(t, sdev, ServerConfig{Slots: 256, Clock: clk})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, Clock: clk}
	reg := startClient(t, f.device(), ccfg)
	for g := uint32(1); g <= gids; g++ {
		if _, err := rawRegister(ctx, reg, testNode(g, uint64(g)), 0); err != nil {
			t.Fatal(err)
		}
	}
	cs := make([]*Client, clients)
	for i := range cs {
		cs[i] = startClient(t, f.device(), ccfg)
	}

	from := sdev.Addr()
	f.net.SetFilter(func(src, _ netip.AddrPort, _ wire.Header, _ []byte) softnictest.Verdict {
		if src == from {
			return softnictest.Delay(serverStall)
		}
		return softnictest.Pass
	})
	var wg sync.WaitGroup
	errs := make(chan error, clients*gids)
	for _, c := range cs {
		for g := uint32(1); g <= gids; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := c.Lookup(ctx, g)
				if err == nil && !consistent(n) {
					err = errors.New("inconsistent entry")
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// Move time in small steps (letting the lookups post between them)
	// until every lookup returned: at most a few stalls' worth.
	for moved := time.Duration(0); ; moved += 5 * time.Millisecond {
		select {
		case <-done:
		default:
			if moved > 20*serverStall {
				t.Fatalf("lookups still pending after %v of clock time", moved)
			}
			clk.Advance(5 * time.Millisecond)
			time.Sleep(200 * time.Microsecond)
			continue
		}
		break
	}
	f.net.SetFilter(nil)
	close(errs)
	for err := range errs {
		t.Errorf("lookup under a slow server: %v", err)
	}
	for i, c := range cs {
		st := c.Stats()
		if st.Connects != 1 || st.Failovers != 0 {
			t.Errorf("client %d: %d connects, %d failovers for %d lookups; want 1 connect, no failover",
				i, st.Connects, st.Failovers, st.Lookups)
		}
		if st.Reads < gids {
			t.Errorf("client %d: %d READs for %d cold gids", i, st.Reads, gids)
		}
	}
}

// TestUnreachableErrno: a lookup with no meta server answering fails with
// ErrUnreachable, whose errno is EHOSTDOWN (not an errno-less error a
// file system would turn into EIO); an unknown gid is ENOENT.
func TestUnreachableErrno(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	sdev := f.device()
	srv := startServer(t, sdev, ServerConfig{Slots: 64})
	c := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()},
		RPCTimeout: 100 * time.Millisecond, ConnectTimeout: 100 * time.Millisecond})
	_, err := c.Lookup(ctx, 7)
	var me *Error
	if !errors.Is(err, ErrNotFound) || !errors.As(err, &me) || me.Errno() != syscall.ENOENT {
		t.Fatalf("unknown gid: %v, want ErrNotFound with ENOENT", err)
	}
	srv.Close()
	sdev.Close()
	_, err = c.Lookup(ctx, 8)
	if !errors.Is(err, ErrUnreachable) || !errors.As(err, &me) || me.Errno() != syscall.EHOSTDOWN {
		t.Fatalf("server down: %v, want ErrUnreachable with EHOSTDOWN", err)
	}
}
