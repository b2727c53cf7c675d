package qpcore_test

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// An atomic's error says whether it may have executed. A peer stops (its
// process is stopped: the requests it is sent wait in its socket) for
// longer than PeerTimeout, then continues and executes them. Atomics that
// failed with an error meaning "not executed" (EHOSTDOWN) must not be
// among them: the counter ends at most at the successes plus the failures
// whose outcome is unknown (ErrAtomicLost, ETIMEDOUT).
func TestAtomicErrorsTellWhetherItRan(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{PeerTimeout: liveTimeout, DCIs: 2})
	b := c.add(2, 4096, peerCfg)
	ctx := ctxT(t, 30*time.Second)
	v := mustConnect(t, a.n, 2)
	if err := v.Write(ctx, make([]byte, 8), "mem", 0); err != nil {
		t.Fatal(err)
	}
	bAddr := netip.MustParseAddrPort(b.addr)

	// B is stopped: what is sent to it arrives (and runs) 3 timeouts
	// later; it sends nothing meanwhile.
	stopped := true
	c.net.SetFilter(func(_, to netip.AddrPort, _ wire.Header, _ []byte) softnictest.Verdict {
		if stopped && to == bAddr {
			return softnictest.Delay(3 * liveTimeout)
		}
		return softnictest.Pass
	})
	// In rounds: the first round's atomics are in flight when the peer
	// goes silent; later rounds meet a peer declared down, whose
	// operations fail at once but for one probe per attempt.
	const rounds, per = 12, 8
	ok, unknown, notRun := 0, 0, 0
	other := map[string]int{}
	cs := make([]qpcore.Completion, per)
	for r := range rounds {
		wrs := make([]qpcore.WR, per)
		for i := range wrs {
			wrs[i] = qpcore.WR{ID: uint64(r*per + i), Op: qpcore.OpFetchAdd, Region: "mem", Offset: 0, Add: 1}
		}
		n, err := v.Post(ctx, wrs, 0)
		if n < len(wrs) {
			// Refused at once: the peer is down and this is not its probe.
			if !errors.Is(err, syscall.EHOSTDOWN) {
				t.Fatalf("post refused WR %d: %v", n, err)
			}
			notRun += len(wrs) - n
		}
		for got := 0; got < n; {
			_, err := c.drive(liveStep, 10*liveTimeout, func() error { return v.Wait(ctx) })
			if err != nil {
				t.Fatal(err)
			}
			k := v.Poll(cs)
			for _, x := range cs[:k] {
				switch {
				case x.Err == nil:
					ok++
				case errors.Is(x.Err, qpcore.ErrAtomicLost):
					if !errors.Is(x.Err, syscall.ETIMEDOUT) {
						t.Errorf("an atomic of unknown outcome reports %v, want ETIMEDOUT", x.Err)
					}
					unknown++
				case errors.Is(x.Err, syscall.EHOSTDOWN):
					notRun++
				default:
					other[x.Err.Error()]++
				}
			}
			got += k
		}
		c.advance(liveTimeout/4, liveStep, settle)
	}
	const adds = rounds * per
	// B continues: everything that waited in its socket runs.
	stopped = false
	c.advance(4*liveTimeout, liveStep, settle)
	c.net.SetFilter(nil)
	var word []byte
	c.until("the peer answers again", liveStep, 10*liveTimeout, func() bool {
		word = make([]byte, 8)
		_, err := c.drive(liveStep, 10*liveTimeout, func() error { return v.Read(ctx, word, "mem", 0) })
		return err == nil
	})
	counter := int(binary.LittleEndian.Uint64(word))
	t.Logf("%d FETCH_ADDs: %d succeeded, %d outcome unknown, %d not run (EHOSTDOWN), other %v; the counter ended at %d",
		adds, ok, unknown, notRun, other, counter)
	if len(other) != 0 {
		t.Errorf("unexpected errors: %v", other)
	}
	if counter < ok || counter > ok+unknown {
		t.Fatalf("counter %d after %d successes and %d failures of unknown outcome: an atomic reported as not run ran", counter, ok, unknown)
	}
	if notRun == 0 || unknown == 0 {
		t.Errorf("want both kinds of failure in this scenario: %d not run, %d unknown", notRun, unknown)
	}
}
