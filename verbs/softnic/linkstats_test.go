package softnic_test

import (
	"testing"

	"github.com/krfs/krfs/verbs/softnic/link"
)

// statsLink is a link whose counters are fixed.
type statsLink struct {
	link.Link
	st link.Stats
}

func (l statsLink) Stats() link.Stats { return l.st }

// TestDeviceStatsReportLinkErrors: what the link could not send (dropped
// or refused) and the failed receives reach verbs.DeviceStats, which the
// daemon's stats and metrics show (krfs_nic_tx_errors_total,
// krfs_nic_rx_errors_total); the engine itself ignores send errors (the
// protocol retransmits).
func TestDeviceStatsReportLinkErrors(t *testing.T) {
	fb := newFabric(t, "fake", faults{})
	st := link.Stats{TxSyscalls: 11, RxSyscalls: 13, TxErrors: 7, TxDrops: 5, RxErrors: 2}
	fb.open = func() link.Link { return statsLink{fb.net.NewLink(), st} }
	d := fb.node().dev.Stats()
	if d.TxSyscalls != 11 || d.RxSyscalls != 13 || d.TxErrors != 7 || d.TxDropped != 5 || d.RxErrors != 2 {
		t.Errorf("device stats %+v from link stats %+v", d, st)
	}
}
