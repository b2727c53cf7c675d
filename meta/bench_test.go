package meta

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic/softnictest"
)

// benchSetup starts a meta server holding nodes 1..n on a fabric of the
// given kind and returns it with its fabric.
func benchSetup(b *testing.B, kind string, n int) (*fabric, *Server) {
	b.Helper()
	f := newFabric(b, kind, softnictest.Config{Seed: 1})
	clk := softnictest.NewManualClock(time.Time{}) // leases never run out
	srv := startServer(b, f.device(), ServerConfig{Slots: 1024, Clock: clk})
	reg := startClient(b, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	ctx := context.Background()
	for g := uint32(1); g <= uint32(n); g++ {
		if _, err := rawRegister(ctx, reg, testNode(g, uint64(g)), 0); err != nil {
			b.Fatal(err)
		}
	}
	return f, srv
}

// BenchmarkMetaCacheHit is a Lookup answered by the DCCache.
func BenchmarkMetaCacheHit(b *testing.B) {
	f, srv := benchSetup(b, "fake", 64)
	c := startClient(b, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
	ctx := context.Background()
	for g := uint32(1); g <= 64; g++ {
		if _, err := c.Lookup(ctx, g); err != nil {
			b.Fatal(err)
		}
	}
	c.waitDCCache().Wait()
	reads := c.Stats().Reads
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := c.Lookup(ctx, uint32(1+i%64)); err != nil {
			b.Fatal(err)
		}
	}
	if got := c.Stats().Reads - reads; got != 0 {
		b.Fatalf("%d lookups missed the cache", got)
	}
	// The target is 200 ns.
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/200, "hit/target")
}

// BenchmarkMetaMissVsRead compares a one-sided Lookup that misses the
// cache (cache check, one READ of the gid's neighbourhood, decode, cache
// fill) with a plain READ of the same size on the same connection; the
// two alternate, so they see the same machine.
func BenchmarkMetaMissVsRead(b *testing.B) {
	for _, kind := range fabricKinds {
		b.Run(kind, func(b *testing.B) {
			f, srv := benchSetup(b, kind, 64)
			c := startClient(b, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}})
			ctx := context.Background()
			cn := c.anyLive()
			defer cn.unref()
			size := cn.geom.nbhdBytes()
			var miss, read time.Duration
			for i := 0; b.Loop(); i++ {
				g := uint32(1 + i%64)
				c.Invalidate(g)
				t0 := time.Now()
				if _, err := c.Lookup(ctx, g); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				slot, seq, err := cn.acquire(ctx, opRead)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := cn.read(ctx, slot, seq, slotOffset(cn.geom.home(g)), size); err != nil {
					b.Fatal(err)
				}
				cn.finish(slot)
				t2 := time.Now()
				miss += t1.Sub(t0)
				read += t2.Sub(t1)
			}
			n := float64(b.N)
			b.ReportMetric(float64(miss.Nanoseconds())/n, "miss-ns/op")
			b.ReportMetric(float64(read.Nanoseconds())/n, "read-ns/op")
			b.ReportMetric(float64(miss)/float64(read), "miss/read")
		})
	}
}

// BenchmarkMetaOneSidedVsRPC measures lookup throughput of 1 and 8
// client nodes (one goroutine each, no cache) by one-sided READ and by
// RPC. Phases of each kind alternate in rounds, so both see the same
// machine; the ratio is one-sided over RPC throughput.
func BenchmarkMetaOneSidedVsRPC(b *testing.B) {
	for _, kind := range fabricKinds {
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", kind, clients), func(b *testing.B) {
				f, srv := benchSetup(b, kind, 256)
				var cls []*Client
				for range clients {
					cls = append(cls, startClient(b, f.device(), ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1}))
				}
				ctx := context.Background()
				const chunk = 100 // lookups per client per phase
				phase := func(rpc bool) time.Duration {
					var wg sync.WaitGroup
					errs := make(chan error, clients)
					t0 := time.Now()
					for k, c := range cls {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := range chunk {
								g := uint32(1 + (i*clients+k)%256)
								var err error
								if rpc {
									_, err = c.LookupRPC(ctx, g)
								} else {
									_, err = c.Lookup(ctx, g)
								}
								if err != nil {
									errs <- err
									return
								}
							}
						}()
					}
					wg.Wait()
					d := time.Since(t0)
					close(errs)
					for err := range errs {
						b.Fatal(err)
					}
					return d
				}
				phase(false) // warm up both paths
				phase(true)
				var one, rpc time.Duration
				ops := 0
				b.ResetTimer()
				for ops < b.N {
					one += phase(false)
					rpc += phase(true)
					ops += 2 * chunk * clients
				}
				b.StopTimer()
				perPath := float64(ops / 2)
				oneRate := perPath / one.Seconds()
				rpcRate := perPath / rpc.Seconds()
				b.ReportMetric(oneRate, "onesided-ops/s")
				b.ReportMetric(rpcRate, "rpc-ops/s")
				b.ReportMetric(oneRate/rpcRate, "onesided/rpc")
			})
		}
	}
}
