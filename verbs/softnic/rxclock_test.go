package softnic_test

import (
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// TestReadResponsesReadTheClockPerBatch: the response segments of a
// multi-packet READ each restart the ACK timeout, from one clock reading
// per received batch, not one per segment (two vDSO calls each, about 5%
// of a requesting daemon's CPU at 1 MiB READs).
func TestReadResponsesReadTheClockPerBatch(t *testing.T) {
	checkLeaks(t)
	// A step fabric whose packets coalesce as udplink's GRO batches do.
	clk := softnictest.NewManualClock(time.Time{})
	fb := &fabric{name: "fake", t: t, clock: clk}
	fb.net = softnictest.NewNetwork(softnictest.Config{Seed: 7, Clock: clk, AutoFlush: true, Coalesce: 1})
	t.Cleanup(func() { fb.net.Close() })
	cc := &countingClock{ManualClock: clk}
	fb.clock = cc
	a := fb.node() // the requester reads cc
	fb.clock = clk
	b := fb.node()
	qa, _ := connect(t, a, b, stepTimeout)
	const size = 256 << 10
	for i := range size {
		b.mem[i] = byte(i * 7)
	}
	b.dev.SyncMemory()
	before, rx0 := cc.nows.Load(), a.dev.Stats().RxPackets
	post(t, qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, size), RemoteAddr: 0, RKey: b.mr.RKey()})
	if wc := poll(t, a.cq, 1, 0)[0]; wc.Err() != nil {
		t.Fatalf("READ: %v", wc.Err())
	}
	reads, pkts := cc.nows.Load()-before, a.dev.Stats().RxPackets-rx0
	if pkts < 16 {
		t.Fatalf("the READ came back in %d packets; the test needs many", pkts)
	}
	if reads > int64(pkts)/4 {
		t.Errorf("%d clock readings for a READ of %d response packets", reads, pkts)
	}
	for i := range size {
		if a.mem[i] != byte(i*7) {
			t.Fatalf("byte %d: %d, want %d", i, a.mem[i], byte(i*7))
		}
	}
	t.Logf("%d clock readings, %d packets received", reads, pkts)
}
