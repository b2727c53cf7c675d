package meta

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// countingClock counts the timers armed on it.
type countingClock struct {
	*softnictest.ManualClock
	timers atomic.Int64
}

func (c *countingClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.timers.Add(1)
	return c.ManualClock.AfterFunc(d, f)
}

// TestIdleClientSleeps: an idle client keeps its connection (a ping each
// IdleTimeout/3) without waking at every RetryInterval: over two minutes
// it arms a few timers per ping, not one per 200 ms tick (600, as its
// maintenance ticker did, a wake-up of every idle node five times a
// second, most of a 10,000-node simulation's time once it converged). A
// connection that dies is still made again at the next tick.
func TestIdleClientSleeps(t *testing.T) {
	checkLeaks(t)
	clk := softnictest.NewManualClock(time.Time{})
	f := newFabric(t, "fake", softnictest.Config{Seed: 1, Clock: clk, AutoFlush: true})
	srv := startServer(t, f.device(), ServerConfig{Clock: clk})
	cc := &countingClock{ManualClock: clk}
	cl := startClient(t, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1, Clock: cc})
	settle(f, srv)
	armed := cc.timers.Load()
	const idle = 2 * time.Minute // four times the server's IdleTimeout
	advance(clk, idle, 100*time.Millisecond, func() { settle(f, srv) })
	ticks := int64(idle / DefaultRetryInterval)
	if n := cc.timers.Load() - armed; n > ticks/10 {
		t.Fatalf("an idle client armed %d timers in %v (%d ticks of %v)", n, idle, ticks, DefaultRetryInterval)
	}
	t.Logf("an idle client armed %d timers in %v", cc.timers.Load()-armed, idle)
	if st := cl.Stats(); st.Connects != 1 || srv.Stats().Conns != 1 || srv.Stats().Reaped != 0 {
		t.Fatalf("idle connection not kept: client %+v, server %+v", st, srv.Stats())
	}
	cn := cl.servers[0].live()
	if cn == nil {
		t.Fatal("no live connection")
	}
	cn.kill()
	cn.unref()
	advance(clk, DefaultRetryInterval, 10*time.Millisecond, func() { settle(f, srv) })
	if st := cl.Stats(); st.Connects != 2 {
		t.Fatalf("a connection that died was not made again within a tick: %+v", st)
	}
}
