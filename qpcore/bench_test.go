package qpcore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/bench/baseline"
	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// readResolver resolves gids with one one-sided READ of a 64-byte entry
// in a "meta" device's registered table, with no cache: the shape of the
// meta service's miss path.
type readResolver struct {
	metaDev, dev *softnic.Device
	table        []byte
	tmr          verbs.MR
	cq           verbs.CQ
	qp           verbs.QP
	buf          []byte
	mr           verbs.MR
	mu           sync.Mutex
}

const metaEntry = 64

func newReadResolver(tb testing.TB, maxGID int) *readResolver {
	r := &readResolver{}
	var err error
	if r.metaDev, err = softnic.OpenUDP("127.0.0.1:0"); err != nil {
		tb.Fatal(err)
	}
	if r.dev, err = softnic.OpenUDP("127.0.0.1:0"); err != nil {
		tb.Fatal(err)
	}
	mpd, _ := r.metaDev.AllocPD()
	mcq, _ := r.metaDev.CreateCQ(16)
	r.table = make([]byte, (maxGID+1)*metaEntry)
	if r.tmr, err = mpd.RegMR(r.table, verbs.AccessRemoteRead); err != nil {
		tb.Fatal(err)
	}
	r.metaDev.ListenRC(1, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
		q, err := mpd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: mcq, RecvCQ: mcq})
		return q, nil, err
	})
	pd, _ := r.dev.AllocPD()
	r.cq, _ = r.dev.CreateCQ(16)
	r.qp, _ = pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: r.cq, RecvCQ: r.cq})
	// The QP's retry budget is a failure detector (8 s), not a bound a
	// loaded machine may miss: a stalled meta device is retried, not
	// declared dead after the default ACK timeout.
	if _, err := r.dev.ConnectRC(context.Background(), r.qp, r.metaDev.Addr(), 1, verbs.ConnParams{Timeout: time.Second, RetryCnt: 7}); err != nil {
		tb.Fatal(err)
	}
	r.buf = make([]byte, metaEntry)
	r.mr, _ = pd.RegMR(r.buf, verbs.AccessLocalWrite)
	tb.Cleanup(func() { r.dev.Close(); r.metaDev.Close() })
	return r
}

func (r *readResolver) set(info meta.NodeInfo) {
	e := r.table[int(info.GID)*metaEntry:][:metaEntry]
	binary.LittleEndian.PutUint32(e[0:], info.GID)
	binary.LittleEndian.PutUint64(e[4:], info.Incarnation)
	a := info.Addr.Addr().As4()
	copy(e[12:16], a[:])
	binary.LittleEndian.PutUint16(e[16:], info.Addr.Port())
	binary.LittleEndian.PutUint32(e[18:], info.DCTN)
	binary.LittleEndian.PutUint64(e[22:], info.DCKey)
	binary.LittleEndian.PutUint32(e[30:], info.DirRKey)
	binary.LittleEndian.PutUint32(e[34:], info.DirLen)
	binary.LittleEndian.PutUint32(e[38:], info.MemRKey)
	binary.LittleEndian.PutUint64(e[42:], info.MemLen)
	e[50] = byte(info.MemAccess)
	r.metaDev.SyncMemory()
}

// read is one synchronous 64-byte READ of entry gid.
func (r *readResolver) read(ctx context.Context, gid uint32) error {
	if err := r.qp.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled,
		Local: verbs.SGE{MR: r.mr, Length: metaEntry}, RemoteAddr: r.tmr.IOVA() + uint64(gid)*metaEntry, RKey: r.tmr.RKey()}}); err != nil {
		return err
	}
	var wc [1]verbs.WC
	for r.cq.Poll(wc[:]) == 0 {
		if err := r.cq.Wait(ctx); err != nil {
			return err
		}
	}
	return wc[0].Err()
}

func (r *readResolver) Lookup(ctx context.Context, gid uint32) (meta.NodeInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.read(ctx, gid); err != nil {
		return meta.NodeInfo{}, err
	}
	e := r.buf
	if binary.LittleEndian.Uint32(e) != gid {
		return meta.NodeInfo{}, meta.ErrNotFound
	}
	var a [4]byte
	copy(a[:], e[12:16])
	return meta.NodeInfo{GID: gid, Incarnation: binary.LittleEndian.Uint64(e[4:]),
		Addr: netip.AddrPortFrom(netip.AddrFrom4(a), binary.LittleEndian.Uint16(e[16:])),
		DCTN: binary.LittleEndian.Uint32(e[18:]), DCKey: binary.LittleEndian.Uint64(e[22:]),
		DirRKey: binary.LittleEndian.Uint32(e[30:]), DirLen: binary.LittleEndian.Uint32(e[34:]),
		MemRKey: binary.LittleEndian.Uint32(e[38:]), MemLen: binary.LittleEndian.Uint64(e[42:]),
		MemAccess: verbs.Access(e[50])}, nil
}

func (r *readResolver) Invalidate(uint32) {}

func reportLat(b *testing.B, name string, l baseline.Latencies) baseline.Summary {
	s := l.Summary()
	b.ReportMetric(float64(s.Typical)/1e3, name+"-p50-us")
	return s
}

// benchNodes makes node a (gid 1) and peer b (gid 2) over the resolver.
func benchNodes(b testing.TB, res qpcore.Resolver, set func(meta.NodeInfo)) (*qpcore.Node, *qpcore.Node, func()) {
	var devs []*softnic.Device
	var nodes []*qpcore.Node
	for gid := uint32(1); gid <= 2; gid++ {
		dev, err := softnic.OpenUDP("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		// A loaded machine must not fail a measurement: operations get
		// the meshes' failure-detector deadline, not 1 s.
		n, err := qpcore.NewNode(dev, res, qpcore.Config{GID: gid, NoDrive: os.Getenv("KRFS_NODRIVE") != "", PeerTimeout: meshOpTimeout})
		if err != nil {
			b.Fatal(err)
		}
		set(n.Info())
		devs, nodes = append(devs, dev), append(nodes, n)
	}
	return nodes[0], nodes[1], func() {
		for i := range nodes {
			nodes[i].Close()
			devs[i].Close()
		}
	}
}

// BenchmarkQPCoreConnect measures, in one run: Connect to a known peer
// (warm), Connect to an unknown peer through a resolver that does one
// real one-sided READ (cold) beside that READ alone, and an RC QP made
// from scratch with the connection manager's handshake (the verbs way).
func BenchmarkQPCoreConnect(b *testing.B) {
	ctx := context.Background()
	res := newReadResolver(b, 4)
	a, _, done := benchNodes(b, res, res.set)
	defer done()
	// Warm connects run b.N times (they are what ns/op times); the slower
	// measurements beside them at most 2,000 times.
	iters := min(max(b.N, 200), 2000)
	// Warm: the peer is known.
	v, err := a.Connect(ctx, 2)
	if err != nil {
		b.Fatal(err)
	}
	v.Close()
	warm := make(baseline.Latencies, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		v, err := a.Connect(ctx, 2)
		warm = append(warm, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		v.Close()
	}
	b.StopTimer()
	// One READ of a meta entry, the floor of a cold connect.
	read := make(baseline.Latencies, 0, iters)
	cold := make(baseline.Latencies, 0, iters)
	for range iters {
		t0 := time.Now()
		if err := res.read(ctx, 2); err != nil {
			b.Fatal(err)
		}
		read = append(read, time.Since(t0))
		if !a.Forget(2) {
			b.Fatal("peer still in use")
		}
		t0 = time.Now()
		v, err := a.Connect(ctx, 2)
		cold = append(cold, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		v.Close()
	}
	// RC from scratch: create a QP, handshake, (then destroy both ends).
	rc := rcFromScratch(b, iters)
	ws, cs, rs, rcs := reportLat(b, "warm", warm), reportLat(b, "cold", cold), reportLat(b, "read", read), reportLat(b, "rc", rc)
	b.ReportMetric(baseline.Ratio(cs.Typical, rs.Typical), "cold-x-read")
	b.ReportMetric(baseline.Ratio(rcs.Typical, ws.Typical), "rc-x-warm")
	b.ReportMetric(baseline.Ratio(rcs.Typical, cs.Typical), "rc-x-cold")
}

// rcFromScratch times iters RC connections made the verbs way.
func rcFromScratch(b *testing.B, iters int) baseline.Latencies {
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
	var mu sync.Mutex
	var passive []verbs.QP
	d2.ListenRC(9, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
		q, err := pd2.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq2, RecvCQ: cq2})
		mu.Lock()
		passive = append(passive, q)
		mu.Unlock()
		return q, nil, err
	})
	lat := make(baseline.Latencies, 0, iters)
	for range iters {
		t0 := time.Now()
		q, err := pd1.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq1, RecvCQ: cq1})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := d1.ConnectRC(context.Background(), q, d2.Addr(), 9, verbs.ConnParams{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		q.Destroy()
		mu.Lock()
		for _, p := range passive {
			p.Destroy()
		}
		passive = passive[:0]
		mu.Unlock()
	}
	return lat
}

func BenchmarkQPCoreConnectWarm(b *testing.B) {
	res := newResolver(clock.System{})
	a, _, done := benchNodes(b, res, res.set)
	defer done()
	ctx := context.Background()
	v, _ := a.Connect(ctx, 2)
	v.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		v, err := a.Connect(ctx, 2)
		if err != nil {
			b.Fatal(err)
		}
		v.Close()
	}
}

// memPair starts two nodes on loopback UDP (benchNodes), node 2 exporting
// a 4 KiB region "mem", and returns node 1's VQP to node 2; done closes
// the VQP and the nodes.
func memPair(tb testing.TB) (v *qpcore.VQP, done func()) {
	res := newResolver(clock.System{})
	a, p, stop := benchNodes(tb, res, res.set)
	if _, err := p.Export("mem", verbs.PageAligned(4096), verbs.AccessRemoteRead); err != nil {
		stop()
		tb.Fatal(err)
	}
	v, err := a.Connect(context.Background(), 2)
	if err != nil {
		stop()
		tb.Fatal(err)
	}
	return v, func() { v.Close(); stop() }
}

// BenchmarkQPCoreRead is a synchronous 64-byte READ through a VQP (DC).
func BenchmarkQPCoreRead(b *testing.B) {
	v, done := memPair(b)
	defer done()
	ctx := context.Background()
	buf := make([]byte, 64)
	lat := make(baseline.Latencies, 0, b.N)
	b.ResetTimer()
	b.StopTimer()
	// The ping-pong runs in chunks between chunks of READs (see
	// baseline.Alternate), each after a warm-up; b's timer counts only the
	// timed READs.
	base, err := baseline.Alternate(baseline.LocalRounds(b.N), b.N, 64, func(k int) error {
		for range baseline.Warmup {
			if err := v.Read(ctx, buf, "mem", 0); err != nil {
				return err
			}
		}
		b.StartTimer()
		defer b.StopTimer()
		for range k {
			t0 := time.Now()
			if err := v.Read(ctx, buf, "mem", 0); err != nil {
				return err
			}
			lat = append(lat, time.Since(t0))
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	s := reportLat(b, "read", lat)
	bs := base.Summary()
	b.ReportMetric(float64(bs.Typical)/1e3, "udp-pingpong-p50-us")
	b.ReportMetric(baseline.Ratio(s.Typical, bs.Typical), "x-udp-pingpong")
}

// memNow returns the heap in use after a GC and the process RSS.
func memNow() (heap, rss uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		f := strings.Fields(string(b))
		if len(f) > 1 {
			pages, _ := strconv.ParseUint(f[1], 10, 64)
			rss = pages * uint64(os.Getpagesize())
		}
	}
	return ms.HeapInuse, rss
}

// BenchmarkQPCoreMemory reports a node's heap with P peers known (each
// connected once) and 1,000 VQPs open, for P = 1,000, 5,000 and 10,000,
// and the growth per peer between the last two; beside it, what an RC mesh
// costs per peer (an active and a passive RC QP). One iteration is one
// whole measurement: run it with -benchtime=1x.
func BenchmarkQPCoreMemory(b *testing.B) {
	ctx := context.Background()
	var heaps []float64
	points := []int{1000, 5000, 10000}
	for range b.N {
		heaps = heaps[:0]
		for _, peers := range points {
			res := newResolver(clock.System{})
			for g := 2; g < 2+peers; g++ {
				res.set(meta.NodeInfo{GID: uint32(g), Incarnation: 1,
					Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(10000+g%50000)),
					DCTN: 77, DCKey: 1, DirRKey: 1, DirLen: 4096})
			}
			dev, err := softnic.OpenUDP("127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			h0, r0 := memNow()
			n, err := qpcore.NewNode(dev, res, qpcore.Config{GID: 1})
			if err != nil {
				b.Fatal(err)
			}
			var open []*qpcore.VQP
			for g := 2; g < 2+peers; g++ {
				v, err := n.Connect(ctx, uint32(g))
				if err != nil {
					b.Fatal(err)
				}
				if len(open) < 1000 {
					open = append(open, v)
				} else {
					v.Close()
				}
			}
			h1, r1 := memNow()
			heap := float64(h1-h0) / (1 << 20)
			heaps = append(heaps, heap)
			b.ReportMetric(heap, fmt.Sprintf("heap-MiB-%dpeers", peers))
			if peers == 10000 {
				b.ReportMetric(float64(int64(r1)-int64(r0))/(1<<20), "rss-MiB-10000peers")
				b.ReportMetric(float64(r1)/(1<<20), "process-rss-MiB")
				b.ReportMetric(float64(n.Stats().Peers), "peers-kept")
			}
			for _, v := range open {
				v.Close()
			}
			n.Close()
			dev.Close()
		}
	}
	// Growth per peer beyond MaxPeers (4,096 by default): flat.
	k := len(points) - 1
	slope := (heaps[k] - heaps[k-1]) * (1 << 20) / float64(points[k]-points[k-1])
	b.ReportMetric(slope, "heap-B/peer")
	b.ReportMetric(rcBytesPerPeer(b, 200), "rc-mesh-B/peer")
}

// rcBytesPerPeer measures the heap one RC connection costs: both QPs.
func rcBytesPerPeer(b *testing.B, k int) float64 {
	d1, _ := softnic.OpenUDP("127.0.0.1:0")
	d2, _ := softnic.OpenUDP("127.0.0.1:0")
	defer d1.Close()
	defer d2.Close()
	pd1, _ := d1.AllocPD()
	pd2, _ := d2.AllocPD()
	cq1, _ := d1.CreateCQ(64)
	cq2, _ := d2.CreateCQ(64)
	d2.ListenRC(9, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
		q, err := pd2.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq2, RecvCQ: cq2})
		return q, nil, err
	})
	h0, _ := memNow()
	var qs []verbs.QP
	for range k {
		q, _ := pd1.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq1, RecvCQ: cq1})
		if _, err := d1.ConnectRC(context.Background(), q, d2.Addr(), 9, verbs.ConnParams{}); err != nil {
			b.Fatal(err)
		}
		qs = append(qs, q)
	}
	h1, _ := memNow()
	runtime.KeepAlive(qs)
	return float64(h1-h0) / float64(k)
}

// BenchmarkQPCoreFullMesh240 builds a full mesh of 240 in-process nodes
// on loopback, every node reaching every other: with VQPs (Connect to all
// 239 peers; then one 8-byte READ of each peer's default region),
// and the verbs way with one RC connection per pair (create QP +
// handshake). Lookups go to an in-memory resolver (a meta READ each would
// add about one READ per connect; see BenchmarkQPCoreConnect). One
// iteration is one mesh of each kind: run it with -benchtime=1x.
func BenchmarkQPCoreFullMesh240(b *testing.B) {
	if testing.Short() {
		b.Skip("240 nodes")
	}
	fullMesh(b, 240)
}

// BenchmarkQPCoreFullMeshSweep is the full mesh at N = 16 ... 128 (240 is
// BenchmarkQPCoreFullMesh240), for the mesh-time-vs-N plot.
func BenchmarkQPCoreFullMeshSweep(b *testing.B) {
	for _, n := range []int{16, 32, 64, 128} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { fullMesh(b, n) })
	}
}

// fullMesh: N in-process nodes; every node connects a VQP to every other
// (DCT) and READs once through it (the default region, whose rkey comes
// with the lookup: no directory READ), against an RC mesh (a QP and a CM
// handshake per pair). Every READ is checked (each node's region starts
// with its gid).
//
// Nothing here bounds real time: the machine may be loaded (2 vCPUs
// shared with compilers and other tests), so operations get a deadline
// (PeerTimeout, the CM handshakes' context) far beyond any mesh, and a
// slow run is reported slow instead of failing. The schedule is the one a
// mesh needs on any fabric: in round k node i reaches node i+k, so every
// node serves about one peer at a time. (All nodes reaching node 1 first,
// then node 2, ... makes an incast of N-1 requests on one node's receive
// queue: losses, go-back-N retransmissions, and READs missing a 1 s
// deadline on a loaded machine.)
func fullMesh(b *testing.B, N int) {
	res := newResolver(clock.System{})
	cfg := qpcore.Config{DCIs: 4, RecvBuffers: 2, SendBuffers: 1, MsgThreshold: 4096, RCCap: 1, DisableRC: true,
		PeerTimeout: meshOpTimeout}
	ns := meshNodes(b, N, res, cfg, 77)
	defer func() {
		for _, m := range ns {
			m.n.Close()
			m.dev.Close()
		}
	}()
	ctx := context.Background()
	var dcConnect, dcRead, rcConnect time.Duration
	for range b.N {
		// DC: every node connects to every other, then READs once each.
		var wg sync.WaitGroup
		errs := make(chan error, N)
		vqps := make([][]*qpcore.VQP, N)
		t0 := time.Now()
		for i := range ns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 1; k < N; k++ {
					j := (i + k) % N
					v, err := ns[i].n.Connect(ctx, uint32(j+1))
					if err != nil {
						errs <- err
						return
					}
					vqps[i] = append(vqps[i], v)
				}
			}()
		}
		wg.Wait()
		t1 := time.Now()
		for i := range ns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 8)
				for _, v := range vqps[i] {
					if err := v.Read(ctx, buf, "mem", 0); err != nil {
						errs <- err
						return
					}
					if g := binary.LittleEndian.Uint32(buf); g != v.Peer() {
						errs <- fmt.Errorf("node %d read gid %d's region: it starts with %d", i+1, v.Peer(), g)
						return
					}
				}
			}()
		}
		wg.Wait()
		t2 := time.Now()
		for _, vs := range vqps {
			for _, v := range vs {
				v.Close()
			}
		}
		// RC: one connection per pair, spread over N workers, pairs in
		// the same rounds (distance d = 1, 2, ...: node i to i+d).
		type pair struct{ i, j int }
		pairs := make(chan pair, N*N/2)
		for d := 1; d <= N/2; d++ {
			for i := range N {
				j := (i + d) % N
				if d == N-d && i >= j {
					continue // N even: the pairs at distance N/2 appear twice
				}
				pairs <- pair{i, j}
			}
		}
		close(pairs)
		var mu sync.Mutex
		var qps []verbs.QP
		t3 := time.Now()
		for range N {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for pr := range pairs {
					m := ns[pr.i]
					q, err := m.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: m.cq, RecvCQ: m.cq, Caps: verbs.QPCaps{MaxSendWR: 4}})
					if err == nil {
						cmCtx, cancel := context.WithTimeout(ctx, meshOpTimeout) // each handshake
						_, err = m.dev.ConnectRC(cmCtx, q, ns[pr.j].dev.Addr(), 77, verbs.ConnParams{Timeout: 50 * time.Millisecond})
						cancel()
					}
					if err != nil {
						errs <- fmt.Errorf("RC %d-%d: %w", pr.i, pr.j, err)
						return
					}
					mu.Lock()
					qps = append(qps, q)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		t4 := time.Now()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		for _, q := range qps {
			q.Destroy()
		}
		dcConnect += t1.Sub(t0)
		dcRead += t2.Sub(t1)
		rcConnect += t4.Sub(t3)
	}
	var retx, timeouts, dirReads uint64
	for _, m := range ns {
		dirReads += m.n.Stats().DirReads
		retx += m.dev.Stats().Retransmits
		for _, q := range m.dev.QPs() {
			timeouts += q.Stats.Timeouts
		}
	}
	b.ReportMetric(float64(retx), "retransmits")
	b.ReportMetric(float64(timeouts), "qp-timeouts")
	// The first READ of a peer's "mem" needs no directory READ: the
	// meta entry's hint carries its rkey and length.
	b.ReportMetric(float64(dirReads)/float64(b.N), "dir-reads")
	f := func(d time.Duration) float64 { return float64(d) / float64(b.N) / 1e6 }
	b.ReportMetric(f(dcConnect), "dc-connect-ms")
	b.ReportMetric(f(dcConnect+dcRead), "dc-connect+read-ms")
	b.ReportMetric(f(rcConnect), "rc-connect-ms")
	b.ReportMetric(float64(rcConnect)/float64(dcConnect), "rc-x-dc-connect")
	b.ReportMetric(float64(rcConnect)/float64(dcConnect+dcRead), "rc-x-dc-connect+read")
}

// meshOpTimeout bounds each operation and handshake of the in-process
// meshes: a failure detector, not a performance bound (see fullMesh).
const meshOpTimeout = 30 * time.Second

// BenchmarkQPCoreElasticStart is the paper's RACE-hashing bootstrap case: a
// fresh node (new NIC, new qpcore node, nothing cached) opens and READs
// from 100 peers, against a fresh NIC building an RC connection (QP + CM
// handshake) to each of them and READing once. Peers are found through a
// resolver that answers from memory, so the krfs figure includes no meta
// READ (a cold lookup adds about one READ round trip per peer).
func BenchmarkQPCoreElasticStart(b *testing.B) {
	const N = 100
	res := newResolver(clock.System{})
	cfg := qpcore.Config{DCIs: 8, RecvBuffers: 2, SendBuffers: 1, MsgThreshold: 4096, DisableRC: true}
	peers := meshNodes(b, N, res, cfg, 78)
	defer func() {
		for _, p := range peers {
			p.n.Close()
			p.dev.Close()
		}
	}()
	ctx := context.Background()
	var dcTime, rcTime time.Duration
	for range b.N {
		// krfs: a fresh node, one VQP and one 8-byte READ per peer.
		t0 := time.Now()
		dev, err := softnic.OpenUDP("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		c := cfg
		c.GID = 1000
		n, err := qpcore.NewNode(dev, res, c)
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 8)
		for i := range peers {
			v, err := n.Connect(ctx, uint32(i+1))
			if err == nil {
				err = v.Read(ctx, buf, "mem", 0)
			}
			if err != nil {
				b.Fatalf("peer %d: %v", i+1, err)
			}
		}
		dcTime += time.Since(t0)
		n.Close()
		dev.Close()

		// verbs-style: a fresh NIC, an RC QP and a handshake per peer, then
		// one READ each.
		t1 := time.Now()
		dev, err = softnic.OpenUDP("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(256)
		lmr, _ := pd.RegMR(make([]byte, 8), verbs.AccessLocalWrite)
		wcs := make([]verbs.WC, 1)
		for i := range peers {
			q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Caps: verbs.QPCaps{MaxSendWR: 4}})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := dev.ConnectRC(ctx, q, peers[i].dev.Addr(), 78, verbs.ConnParams{}); err != nil {
				b.Fatalf("RC to peer %d: %v", i+1, err)
			}
			if err := q.PostSend([]verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled, Local: verbs.SGE{MR: lmr, Length: 8}, RKey: peers[i].mr.RKey()}}); err != nil {
				b.Fatal(err)
			}
			for cq.Poll(wcs) == 0 {
				if err := cq.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			if err := wcs[0].Err(); err != nil {
				b.Fatalf("RC READ from peer %d: %v", i+1, err)
			}
		}
		rcTime += time.Since(t1)
		dev.Close()
	}
	f := func(d time.Duration) float64 { return float64(d) / float64(b.N) / 1e6 }
	b.ReportMetric(f(dcTime), "krfs-ms")
	b.ReportMetric(f(rcTime), "rc-ms")
	b.ReportMetric(float64(rcTime)/float64(dcTime), "rc-x-krfs")
}

// benchNode is one in-process node of the mesh and elastic-start
// benchmarks: a qpcore node exporting 4 KiB as "mem", and beside it an RC
// listener (CM service svc) whose QPs reach the same memory through mr, for
// the verbs-style baselines.
type benchNode struct {
	dev *softnic.Device
	n   *qpcore.Node
	pd  verbs.PD
	cq  verbs.CQ
	mr  verbs.MR
}

// meshNodes starts N nodes with gids 1..N, registered in res.
func meshNodes(b *testing.B, N int, res *mapResolver, cfg qpcore.Config, svc uint32) []*benchNode {
	ns := make([]*benchNode, N)
	for i := range ns {
		dev, err := softnic.OpenUDP("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		c := cfg
		c.GID = uint32(i + 1)
		n, err := qpcore.NewNode(dev, res, c)
		if err != nil {
			b.Fatal(err)
		}
		mem := verbs.PageAligned(4096)
		binary.LittleEndian.PutUint32(mem, c.GID)
		if _, err := n.Export("mem", mem, verbs.AccessRemoteRead); err != nil {
			b.Fatal(err)
		}
		res.set(n.Info())
		m := &benchNode{dev: dev, n: n}
		m.pd, _ = dev.AllocPD()
		m.cq, _ = dev.CreateCQ(1024)
		if m.mr, err = m.pd.RegMR(mem, verbs.AccessRemoteRead|verbs.AccessLocalWrite); err != nil {
			b.Fatal(err)
		}
		dev.ListenRC(svc, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
			q, err := m.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: m.cq, RecvCQ: m.cq, Caps: verbs.QPCaps{MaxSendWR: 4}})
			return q, nil, err
		})
		ns[i] = m
	}
	return ns
}
