package qpcore_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// BenchmarkQPCoreRCOnlyMemory reports what RC-only mode costs in memory on
// softnic: the heap of one RC connection as qpcore builds it (the active
// QP with RCDepth send WRs, and the passive QP on the peer, which shares
// the SRQ), against the heap of a node's fixed DC resources (the DCI pool
// and the DCT: a default node minus a NoDC node). One iteration is one
// whole measurement: run it with -benchtime=1x.
func BenchmarkQPCoreRCOnlyMemory(b *testing.B) {
	for range b.N {
		active, passive := rcConnBytes(b, 200)
		b.ReportMetric(active, "rc-active-B/conn")
		b.ReportMetric(passive, "rc-passive-B/conn")
		b.ReportMetric(dcFixedBytes(b), "dc-fixed-B/node")
	}
}

// rcConnBytes connects k RC QPs with qpcore's caps between two devices
// and returns the heap per connection on each side.
func rcConnBytes(b *testing.B, k int) (active, passive float64) {
	d1, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer d1.Close()
	d2, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer d2.Close()
	pd1, _ := d1.AllocPD()
	pd2, _ := d2.AllocPD()
	cq1, _ := d1.CreateCQ(64)
	cq2, _ := d2.CreateCQ(64)
	srq, err := pd2.CreateSRQ(64)
	if err != nil {
		b.Fatal(err)
	}
	var passives []verbs.QP
	d2.ListenRC(9, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
		q, err := pd2.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq2, RecvCQ: cq2, SRQ: srq,
			Caps: verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1}})
		passives = append(passives, q)
		return q, nil, err
	})
	// The active QPs first, unconnected, then the connections (which add
	// the passive QPs and the connection state on both sides).
	h0, _ := memNow()
	var qs []verbs.QP
	for range k {
		q, err := pd1.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq1, RecvCQ: cq1,
			Caps: verbs.QPCaps{MaxSendWR: qpcore.DefaultRCDepth, MaxRecvWR: 1}})
		if err != nil {
			b.Fatal(err)
		}
		qs = append(qs, q)
	}
	h1, _ := memNow()
	for _, q := range qs {
		if _, err := d1.ConnectRC(context.Background(), q, d2.Addr(), 9, verbs.ConnParams{}); err != nil {
			b.Fatal(err)
		}
	}
	h2, _ := memNow()
	runtime.KeepAlive(qs)
	runtime.KeepAlive(passives)
	// The second figure is the passive QP plus the connection state of
	// both sides: the two together are what one connection costs.
	return float64(h1-h0) / float64(k), float64(h2-h1) / float64(k)
}

// dcFixedBytes is the heap of a default node minus that of a NoDC node:
// the DCI pool and the DCT, which cost the same whatever the cluster size.
func dcFixedBytes(b *testing.B) float64 {
	heap := func(cfg qpcore.Config) uint64 {
		dev, err := softnic.OpenUDP("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer dev.Close()
		h0, _ := memNow()
		cfg.GID = 1
		n, err := qpcore.NewNode(dev, newResolver(clock.System{}), cfg)
		if err != nil {
			b.Fatal(err)
		}
		h1, _ := memNow()
		n.Close()
		return h1 - h0
	}
	var dc, rc uint64
	for range 3 { // the minimum of three: a GC's leftovers only add
		d, r := heap(qpcore.Config{}), heap(qpcore.Config{NoDC: true})
		if dc == 0 || d < dc {
			dc = d
		}
		if rc == 0 || r < rc {
			rc = r
		}
	}
	return float64(int64(dc) - int64(rc))
}
