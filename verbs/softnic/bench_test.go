package softnic_test

import (
	"context"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/krfs/krfs/bench/baseline"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// Performance targets are ratios against baselines measured in the same
// benchmark run (absolute times move 2-4x between runs on these machines):
//
//	BenchmarkReadLatency8B   8-byte READ p50 / raw-syscall UDP ping-pong p50   target <= 1.25
//	BenchmarkReadRate32      READs/s with 32 outstanding / sendmmsg echo rate    target >= 0.8
//	BenchmarkReadBandwidth1M 1 MiB READ bandwidth / loopback TCP bandwidth     target >= 0.7

func benchPair(b testing.TB) (*node, *node, verbs.QP) {
	fb := newFabric(b, "udp", faults{})
	a, s := fb.node(), fb.node()
	qa, _ := connect(b, a, s, 0)
	return a, s, qa
}

// waitOne polls the CQ once and otherwise blocks in Wait: on two vCPUs a
// spinning poller steals the CPU the NIC's receive thread needs, while a
// blocked waiter is handed the CPU by that thread the moment the
// completion lands.
func waitOne(ctx context.Context, b *testing.B, cq verbs.CQ, wcs []verbs.WC) verbs.WC {
	for cq.Poll(wcs[:1]) == 0 {
		if err := cq.Wait(ctx); err != nil {
			b.Fatalf("no completion: %v", err)
		}
	}
	if err := wcs[0].Err(); err != nil {
		b.Fatal(err)
	}
	return wcs[0]
}

func p50(l []time.Duration) time.Duration {
	s := append([]time.Duration(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func BenchmarkReadLatency8B(b *testing.B) {
	defer softnic.NoDebugCheck()()
	a, s, qa := benchPair(b)
	wcs := make([]verbs.WC, 1)
	wr := []verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: s.mr.RKey()}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for range 200 { // warm up
		if err := qa.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		waitOne(ctx, b, a.cq, wcs)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	b.StopTimer()
	// The ping-pong runs in chunks between chunks of READs (see
	// baseline.Alternate), each after a warm-up; b's timer counts only the
	// timed READs.
	base, err := baseline.Alternate(baseline.LocalRounds(b.N), b.N, 8, func(k int) error {
		for range baseline.Warmup {
			if err := qa.PostSend(wr); err != nil {
				return err
			}
			waitOne(ctx, b, a.cq, wcs)
		}
		b.StartTimer()
		defer b.StopTimer()
		for range k {
			t0 := time.Now()
			if err := qa.PostSend(wr); err != nil {
				return err
			}
			waitOne(ctx, b, a.cq, wcs)
			lat = append(lat, time.Since(t0))
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	ours, theirs := p50(lat), base.Summary().Typical
	b.ReportMetric(float64(ours.Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(theirs.Nanoseconds())/1e3, "udp-p50-us")
	b.ReportMetric(baseline.Ratio(ours, theirs), "x-udp-p50(target<=1.25)")
}

func BenchmarkReadRate32(b *testing.B) {
	defer softnic.NoDebugCheck()()
	a, s, qa := benchPair(b)
	const depth = 32
	wrs := make([]verbs.SendWR, depth)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, uint64(i*8), 8), RKey: s.mr.RKey(), RemoteAddr: uint64(i * 8)}
	}
	wcs := make([]verbs.WC, depth)
	run := func(n int) time.Duration {
		t0 := time.Now()
		posted, done := 0, 0
		if err := qa.PostSend(wrs[:min(depth, n)]); err != nil {
			b.Fatal(err)
		}
		posted = min(depth, n)
		for done < n {
			k := a.cq.Poll(wcs)
			if k == 0 {
				runtime.Gosched()
				continue
			}
			for _, wc := range wcs[:k] {
				if err := wc.Err(); err != nil {
					b.Fatal(err)
				}
			}
			done += k
			if more := min(k, n-posted); more > 0 {
				if err := qa.PostSend(wrs[:more]); err != nil {
					b.Fatal(err)
				}
				posted += more
			}
		}
		return time.Since(t0)
	}
	run(2000)
	b.ResetTimer()
	el := run(b.N)
	b.StopTimer()
	rate := float64(b.N) / el.Seconds()
	base, err := baseline.EchoRate(depth, 8, 300*time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rate/1e3, "kops/s")
	b.ReportMetric(base/1e3, "echo-kops/s")
	b.ReportMetric(rate/base, "x-echo(target>=0.8)")
}

func BenchmarkReadBandwidth1M(b *testing.B) {
	defer softnic.NoDebugCheck()()
	fb := newFabric(b, "udp", faults{})
	a, s := fb.node(), fb.node()
	qa, _ := connect(b, a, s, 0)
	const size = 1 << 20
	// Registered 4 MiB on each side: 4 READs of 1 MiB in flight.
	lbuf := make([]byte, 4*size)
	lmr, err := a.pd.RegMR(lbuf, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	rbuf := make([]byte, size)
	rmr, err := s.pd.RegMR(rbuf, verbs.AccessRemoteRead)
	if err != nil {
		b.Fatal(err)
	}
	const depth = 4
	wcs := make([]verbs.WC, depth)
	run := func(n int) time.Duration {
		t0 := time.Now()
		posted, done := 0, 0
		for posted < min(depth, n) {
			wr := verbs.SendWR{ID: uint64(posted % depth), Op: verbs.OpRead, Flags: verbs.Signaled, Local: verbs.SGE{MR: lmr, Offset: uint64(posted%depth) * size, Length: size}, RKey: rmr.RKey()}
			if err := qa.PostSend([]verbs.SendWR{wr}); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		for done < n {
			k := a.cq.Poll(wcs)
			if k == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := a.cq.Wait(ctx)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				continue
			}
			for _, wc := range wcs[:k] {
				if err := wc.Err(); err != nil {
					b.Fatal(err)
				}
				done++
				if posted < n {
					wr := verbs.SendWR{ID: wc.ID, Op: verbs.OpRead, Flags: verbs.Signaled, Local: verbs.SGE{MR: lmr, Offset: wc.ID * size, Length: size}, RKey: rmr.RKey()}
					if err := qa.PostSend([]verbs.SendWR{wr}); err != nil {
						b.Fatal(err)
					}
					posted++
				}
			}
		}
		return time.Since(t0)
	}
	run(8)
	b.SetBytes(size)
	b.ResetTimer()
	el := run(b.N)
	b.StopTimer()
	bw := float64(b.N) * size / el.Seconds()
	base, err := baseline.Loopback.TCPBandwidth(size, 256*size, depth)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(bw/1e9, "GB/s")
	b.ReportMetric(base/1e9, "tcp-GB/s")
	b.ReportMetric(bw/base, "x-tcp(target>=0.7)")
	b.ReportMetric(float64(a.dev.Stats().Misplaced), "misplaced-copies")
}

// BenchmarkClusterKeyCost measures, in one run, what packet authentication
// (Config.ClusterKey) and payload encryption (Config.Encrypt) cost: 8-byte
// READ p50 and 1 MiB READ bandwidth with the key, and with the key and
// encryption, against the same without a key.
func BenchmarkClusterKeyCost(b *testing.B) {
	defer softnic.NoDebugCheck()()
	measure := func(key []byte, enc bool) (p50lat time.Duration, bw float64) {
		fb := newFabric(b, "udp", faults{})
		cfg := softnic.Config{ClusterKey: key, Encrypt: enc}
		a, s := keyedNodeCfg(fb, cfg), keyedNodeCfg(fb, cfg)
		qa, _ := connect(b, a, s, 0)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		wcs := make([]verbs.WC, 1)
		wr := []verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, 8), RKey: s.mr.RKey()}}
		lat := make([]time.Duration, 0, 3000)
		for i := range 3200 {
			t0 := time.Now()
			if err := qa.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			waitOne(ctx, b, a.cq, wcs)
			if i >= 200 {
				lat = append(lat, time.Since(t0))
			}
		}
		big := []verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 0, memSize), RKey: s.mr.RKey()}}
		const n = 64
		t0 := time.Now()
		for range n {
			if err := qa.PostSend(big); err != nil {
				b.Fatal(err)
			}
			waitOne(ctx, b, a.cq, wcs)
		}
		return p50(lat), n * memSize / time.Since(t0).Seconds()
	}
	for range b.N {
		plainLat, plainBW := measure(nil, false)
		keyLat, keyBW := measure([]byte("cluster secret"), false)
		encLat, encBW := measure([]byte("cluster secret"), true)
		b.ReportMetric(float64(encLat.Nanoseconds())/1e3, "aead-p50-us")
		b.ReportMetric(baseline.Ratio(encLat, plainLat), "x-latency-aead")
		b.ReportMetric(encBW/1e9, "aead-GB/s")
		b.ReportMetric(encBW/plainBW, "x-bandwidth-aead")
		b.ReportMetric(float64(keyLat.Nanoseconds())/1e3, "key-p50-us")
		b.ReportMetric(float64(plainLat.Nanoseconds())/1e3, "plain-p50-us")
		b.ReportMetric(baseline.Ratio(keyLat, plainLat), "x-latency")
		b.ReportMetric(keyBW/1e9, "key-GB/s")
		b.ReportMetric(plainBW/1e9, "plain-GB/s")
		b.ReportMetric(keyBW/plainBW, "x-bandwidth")
	}
}
