package meta

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// TestStoppedServerRecovers is the SIGSTOP storm: 1,100 nodes heartbeat
// a meta service (10 s leases) whose process is stopped for 15 s of clock
// and then continued. While stopped it neither receives (its socket queues
// what it can hold) nor runs timers; once continued it finds every lease
// expired, removes all 1,100 in one sweep (four table WRITEs each, more
// than its loopback send queue holds) while the nodes' heartbeats are
// refused and they register again. It must recover: every node registered
// and heartbeating again and the table listing exactly the live nodes.
// Before sweeps were cut into groups that fit the send queue, the service
// stayed locked (heartbeats 0 of 1,100, registrations unanswered).
func TestStoppedServerRecovers(t *testing.T) {
	checkLeaks(t)
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 3, Clock: clk, AutoFlush: true})
	// The server's process: its own view of the clock and its own link,
	// both of which stop with it.
	proc := softnictest.NewProcessClock(clk)
	srvLink := f.net.NewLink()
	dev, err := softnic.Open(softnic.Config{Link: srvLink, Clock: proc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	const nodes = 1100
	srv := startServer(t, dev, ServerConfig{Clock: proc, MaxConns: 2 * nodes, MaxConnsPerSource: 2 * nodes})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1, Clock: clk}
	// One client (one connection) per node, as daemons have; 100 hosts
	// carry them.
	ctx := ctxT(t)
	agents := make([]*Agent, nodes)
	var devs []*softnic.Device
	for i := range 100 {
		devs = append(devs, f.hostDevice(i+1))
	}
	var wg sync.WaitGroup
	var started atomic.Int32
	errs := make(chan error, nodes)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer started.Add(1)
			// As a daemon starts: asked again after a backoff if the
			// service did not answer (node.Start does the same).
			var c *Client
			err := untilAnswered(ctx, clk, func() (err error) {
				c, err = NewClient(ctx, devs[i%len(devs)], ccfg)
				return err
			})
			if err != nil {
				errs <- err
				return
			}
			t.Cleanup(func() { c.Close() })
			var a *Agent
			err = untilAnswered(ctx, clk, func() (err error) {
				a, err = c.Register(ctx, testNode(uint32(i+1), uint64(i+1)*1000+1), AgentConfig{})
				return err
			})
			if err != nil {
				errs <- err
				return
			}
			t.Cleanup(func() { a.Close() })
			agents[i] = a
		}()
	}
	// Time moves while they start: a service that sheds some of them
	// (busy) sees them back after their backoff.
	if took, ok := drive(f, clk, 10*time.Millisecond, time.Minute, func() bool { return started.Load() == nodes }, srv); !ok {
		t.Fatalf("%d of %d nodes started after %v", started.Load(), nodes, took)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Heartbeats for a while: everything renews.
	since := clk.Now()
	renewedSince := func(at time.Time) int {
		n := 0
		for _, a := range agents {
			if s := a.Status()[0]; s.Registered && !s.Renewed.Before(at) {
				n++
			}
		}
		return n
	}
	if took, ok := drive(f, clk, 100*time.Millisecond, 10*time.Second, func() bool {
		return clk.Now().Sub(since) >= 4*time.Second && renewedSince(since.Add(time.Second)) == nodes
	}, srv); !ok {
		t.Fatalf("before the stop: %d of %d nodes heartbeating after %v", renewedSince(since.Add(time.Second)), nodes, took)
	}
	// SIGSTOP for 15 s of clock.
	srvLink.StopReceive()
	proc.Stop()
	stopped := clk.Now()
	drive(f, clk, 100*time.Millisecond, 15*time.Second, func() bool { return false }, srv)
	// SIGCONT: the held timers (the sweep among them) fire, the socket is read.
	cont := clk.Now()
	proc.Continue()
	srvLink.ResumeReceive()
	recovered := func() bool {
		st := srv.Stats()
		return st.Expired >= uint64(nodes) && st.Nodes == nodes && renewedSince(cont) == nodes
	}
	took, ok := drive(f, clk, 50*time.Millisecond, 2*time.Minute, recovered, srv)
	st := srv.Stats()
	if !ok {
		t.Fatalf("not recovered %v after the continue: %d of %d renewed since, server %+v", took, renewedSince(cont), nodes, st)
	}
	// The table lists exactly the live nodes, each with its incarnation.
	ctx2, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cl := startClient(t, f.device(), ccfg)
	listed := make(chan []NodeInfo, 1)
	go func() {
		all, err := cl.List(ctx2)
		if err != nil {
			t.Error(err)
		}
		listed <- all
	}()
	drive(f, clk, 10*time.Millisecond, time.Minute, func() bool { return len(listed) > 0 }, srv)
	all := <-listed
	if len(all) != nodes {
		t.Fatalf("List: %d entries for %d live nodes", len(all), nodes)
	}
	for i, n := range all {
		if n != agents[i].Info() {
			t.Fatalf("List[%d] = %+v, want %+v", i, n, agents[i].Info())
		}
	}
	t.Logf("stopped %v; recovered %v of clock time after the continue (all %d nodes registered and heartbeating); server %+v",
		cont.Sub(stopped), took, nodes, st)
}
