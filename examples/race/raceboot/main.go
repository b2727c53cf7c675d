// Command raceboot is the Go side of the RACE bootstrap benchmark: a fresh
// compute-node process that reaches every memory node of a table laid out
// by race.py and serves its first lookup, either through krfs VQPs (its
// own qpcore node over DCT, in-process, as a RACE client linked with krfs
// would) or on RC QPs created from scratch, the verbs way.
//
//	raceboot -mode files -mount /run/krfs-cluster/h5 -nodes 1,2,3 key-00000042
//	raceboot -mode vqp -meta 10.77.0.254:4790 -listen 10.77.0.5:0 -nodes 1,2,3 key-00000042
//	raceboot -mode rc  ... (same flags)
//	raceboot -mode coldpeer -meta ... -listen ... -nodes 1,2,3 -n 200
//	raceboot -mode floor -listen 10.77.0.5:0 -nodes 1,2,3 -echo META,N1,N2,N3 key-00000042
//
// Both bootstrap modes start from nothing: a new software NIC and a meta
// client (one RC connection to the meta service), then one meta lookup per
// memory node (a one-sided READ of the meta table). vqp then opens a VQP
// per node and READs its table header (the meta entry carries the default
// region's rkey: no directory READ); rc creates an RC QP per node, connects it with
// the connection manager's handshake to the node's krfs daemon (the CM
// service qpcore's RC pool listens on), READs the node's region directory
// to learn the default region's rkey, and READs the header. The lookup is
// the same in both: two bucket READs and one key-value block READ.
//
// With -parallel, files, vqp and rc reach the memory nodes all at once
// (a goroutine per node, as a client with a thread per memory node
// would); without it, one after another.
//
// coldpeer measures, in one process, a cold connect plus the first 8-byte
// READ of a peer's default region (qpcore forgets the peer first, so the
// meta entry is read again) against one warm 8-byte READ on the same VQP,
// and reports the connect and the first READ apart.
//
// files is the same Go client on the files of the host's krfs mount: it
// opens no NIC and no meta client, because the daemon holds them (as
// KRCORE's kernel module holds its pool); that is the paper's setting.
//
// It prints one JSON object. Times are in microseconds.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/krfs/krfs/bench/baseline"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/nic"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// qpcoreRCService is the connection-manager service on which a krfs
// daemon's qpcore node accepts RC connections (qpcore/node.go rcService).
const qpcoreRCService = 0x4b524301

// Table layout of race.py.
const (
	hdrLen   = 64
	slots    = 8
	bucket   = slots * 8
	seed2    = 0x9E3779B9
	kvHdrLen = 16
)

type header struct{ nbuckets, nodes uint32 }

func parseHeader(b []byte) (header, error) {
	if string(b[:8]) != "RACEKV01" || binary.LittleEndian.Uint32(b[12:]) != slots {
		return header{}, errors.New("no RACE table (run race.py init and load first)")
	}
	return header{binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[16:])}, nil
}

// locate is race.py's Table.locate.
func locate(key []byte, hs []header) (node int, b1, b2 uint64, fp uint8) {
	h1 := crc32.ChecksumIEEE(key)
	h2 := crc32.Update(seed2, crc32.IEEETable, key)
	nodes := len(hs)
	node = int(h1 % uint32(nodes))
	nb := uint64(hs[node].nbuckets)
	x1 := uint64(h1/uint32(nodes)) % nb
	x2 := uint64(h2) % nb
	if x2 == x1 {
		x2 = (x1 + 1) % nb
	}
	return node, hdrLen + x1*bucket, hdrLen + x2*bucket, uint8(h2 >> 24)
}

// reader READs n bytes at off of memory node i's default region.
type reader func(ctx context.Context, i int, p []byte, off uint64) error

// lookup is race.py's Table.get.
func lookup(ctx context.Context, rd reader, hs []header, key []byte) ([]byte, int, error) {
	i, b1, b2, fp := locate(key, hs)
	reads := 0
	buf := make([]byte, 2*bucket)
	for k, off := range []uint64{b1, b2} {
		if err := rd(ctx, i, buf[k*bucket:(k+1)*bucket], off); err != nil {
			return nil, reads, err
		}
		reads++
	}
	for s := range 2 * slots {
		w := binary.LittleEndian.Uint64(buf[8*s:])
		if w == 0 || uint8(w>>56) != fp {
			continue
		}
		blocks, boff := (w>>48)&0xff, w&(1<<48-1)
		blk := make([]byte, blocks*64)
		if err := rd(ctx, i, blk, boff); err != nil {
			return nil, reads, err
		}
		reads++
		klen := int(binary.LittleEndian.Uint16(blk))
		vlen := int(binary.LittleEndian.Uint32(blk[4:]))
		crc := binary.LittleEndian.Uint32(blk[8:])
		if kvHdrLen+klen+vlen > len(blk) {
			continue
		}
		kv := blk[kvHdrLen : kvHdrLen+klen+vlen]
		if crc32.ChecksumIEEE(kv) == crc && string(kv[:klen]) == string(key) {
			return kv[klen:], reads, nil
		}
	}
	return nil, reads, fmt.Errorf("key %q not found", key)
}

type result struct {
	Mode        string  `json:"mode"`
	Nodes       int     `json:"nodes"`
	Found       int     `json:"found"`
	NICUs       float64 `json:"nic_us"`     // open the software NIC + meta client
	NodeUs      float64 `json:"node_us"`    // vqp: start the in-process qpcore node
	LookupsUs   float64 `json:"meta_us"`    // meta lookups of every node
	ConnectUs   float64 `json:"connect_us"` // VQP or RC QP per node + header READ
	FirstGetUs  float64 `json:"lookup_us"`  // the first key lookup
	BootstrapUs float64 `json:"bootstrap_us"`
	Parallel    bool    `json:"parallel"` // the memory nodes connected all at once
	Reads       int     `json:"lookup_reads"`
	// WallNs is the wall-clock time (Unix ns) at which the value was
	// found, before the process tears its NIC and QPs down: bench.sh's
	// "process" time ends there.
	WallNs int64 `json:"wall_ns"`

	valueAt time.Time // when the value was found
}

// found records that the value is there, n reads after start.
func (r *result) found(start time.Time, v []byte, reads int) {
	r.valueAt = time.Now()
	r.FirstGetUs, r.Found, r.Reads = us(r.valueAt.Sub(start)), len(v), reads
	r.WallNs = r.valueAt.UnixNano()
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// noDrive is the -nodrive flag.
var noDrive bool

// nicOpts are the -backend, -device, -port and -gid-index flags;
// coreCfg is qpcore's configuration for the NIC opened with them
// (RC-only on a device without DC, its transport).
var (
	nicOpts nic.Options
	coreCfg qpcore.Config
)

// echoes is the -echo flag: UDP echo servers (krfs-baseline serve) on the
// meta service's host, then on each memory node's host in -nodes order.
var echoes []netip.AddrPort

func main() {
	mode := flag.String("mode", "vqp", "files, vqp, rc, coldpeer, floor or floor-cold")
	metaAddr := flag.String("meta", "", "meta service HOST:PORT")
	listen := flag.String("listen", "127.0.0.1:0", "address of this process's NIC (softnic's socket, or the rdma backend's connection manager)")
	backend := flag.String("backend", "auto", "verbs backend: auto (an RNIC if a usable one exists, else softnic), softnic or rdma; the memory nodes must use the same")
	flag.StringVar(&nicOpts.Device, "device", "", "rdma: the RDMA device, like mlx5_0")
	flag.IntVar(&nicOpts.Port, "port", 0, "rdma: the device's port number (0: the first active one)")
	flag.IntVar(&nicOpts.GIDIndex, "gid-index", -1, "rdma: the GID table index (-1: the port's RoCEv2 IPv4 GID)")
	flag.IntVar(&nicOpts.TrafficClass, "traffic-class", 0, "rdma: GRH traffic class (RoCEv2: DSCP<<2)")
	nodesFlag := flag.String("nodes", "", "gids of the memory nodes, in race.py's --nodes order")
	iters := flag.Int("n", 100, "coldpeer: iterations")
	timeout := flag.Duration("timeout", 10*time.Second, "give up after this long")
	mount := flag.String("mount", "", "files: this host's krfs mount directory")
	flag.BoolVar(&noDrive, "nodrive", false, "synchronous callers wait for completions through the CQ's notification instead of receiving on their own goroutine (qpcore's NoDrive), for comparison")
	flag.Func("echo", "coldpeer, floor, floor-cold: UDP echo servers (krfs-baseline serve) on the meta service's host and on each memory node's host, in -nodes order (META,NODE1,...): the same pattern of round trips in raw UDP, interleaved, as this run's floor", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			a, err := netip.ParseAddrPort(f)
			if err != nil {
				return fmt.Errorf("want HOST:PORT,...: %w", err)
			}
			echoes = append(echoes, a)
		}
		return nil
	})
	parallel := flag.Bool("parallel", false, "connect to the memory nodes all at once (a goroutine each), not one after another")
	flag.Parse()
	var err error
	if nicOpts.Backend, err = nic.ParseBackend(*backend); err != nil {
		fmt.Fprintln(os.Stderr, "raceboot: -backend:", err)
		os.Exit(2)
	}
	if err := run(*mode, *metaAddr, *listen, *nodesFlag, *mount, *iters, *timeout, *parallel, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "raceboot:", err)
		os.Exit(1)
	}
}

func run(mode, metaAddr, listen, nodesFlag, mount string, iters int, timeout time.Duration, parallel bool, args []string) error {
	t0 := time.Now()
	server, err := netip.ParseAddrPort(metaAddr)
	if err != nil && mode != "files" && mode != "floor" && mode != "floor-cold" {
		return fmt.Errorf("-meta %q: want HOST:PORT", metaAddr)
	}
	var gids []uint32
	for _, f := range strings.Split(nodesFlag, ",") {
		g, err := strconv.ParseUint(f, 10, 32)
		if err != nil || g == 0 {
			return fmt.Errorf("-nodes %q: want gids like 1,2,3", nodesFlag)
		}
		gids = append(gids, uint32(g))
	}
	if mode != "coldpeer" && len(args) != 1 {
		return errors.New("one KEY to look up expected")
	}
	if mode == "floor" || mode == "floor-cold" {
		r, err := bootFloor(listen, len(gids), []byte(args[0]), mode == "floor-cold")
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(r)
	}
	if mode == "files" {
		// No NIC and no meta client of its own: the host's krfs daemon
		// has them, as KRCORE's kernel module does.
		r := result{Mode: mode, Nodes: len(gids), Parallel: parallel}
		if err := bootFiles(mount, gids, []byte(args[0]), &r, t0, parallel); err != nil {
			return err
		}
		r.BootstrapUs = us(r.valueAt.Sub(t0))
		return json.NewEncoder(os.Stdout).Encode(r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	no := nicOpts
	no.Listen = listen
	opened, err := nic.Open(no)
	if err != nil {
		return err
	}
	dev := opened.Dev
	defer dev.Close()
	coreCfg = qpcore.Config{DisableRC: true, NoDrive: noDrive, NoDC: !opened.DC, Transport: opened.Transport}
	mcfg := meta.ClientConfig{Servers: []netip.AddrPort{server}}
	if mode == "rc" {
		// The RC client looks each memory node up once: like a plain
		// verbs client, it has no DCCache.
		mcfg.CacheEntries = -1
	}
	cl, err := meta.NewClient(ctx, dev, mcfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	r := result{Mode: mode, Nodes: len(gids), Parallel: parallel}
	tNIC := time.Now()
	r.NICUs = us(tNIC.Sub(t0))
	switch mode {
	case "coldpeer":
		return coldPeer(ctx, dev, cl, gids, iters)
	case "vqp":
		err = bootVQP(ctx, dev, cl, gids, []byte(args[0]), &r, tNIC, parallel)
	case "rc":
		err = bootRC(ctx, dev, cl, gids, []byte(args[0]), &r, tNIC, parallel)
	default:
		return fmt.Errorf("-mode %q: vqp, rc or coldpeer", mode)
	}
	if err != nil {
		return err
	}
	r.BootstrapUs = us(r.valueAt.Sub(t0))
	return json.NewEncoder(os.Stdout).Encode(r)
}

// eachNode runs connect(i) for every memory node: one after another, or
// all at once with -parallel (one goroutine per node, as a client with a
// thread per memory node connects). Every variant uses it the same way.
func eachNode(n int, parallel bool, connect func(i int) error) error {
	if !parallel {
		for i := range n {
			if err := connect(i); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = connect(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func bootVQP(ctx context.Context, dev verbs.Device, cl *meta.Client, gids []uint32, key []byte, r *result, t1 time.Time, parallel bool) error {
	n, err := qpcore.NewNode(dev, cl, coreCfg)
	if err != nil {
		return err
	}
	defer n.Close()
	r.NodeUs = us(time.Since(t1))
	// Connect does the meta lookup of an unknown peer itself.
	vs := make([]*qpcore.VQP, len(gids))
	hs := make([]header, len(gids))
	defer func() {
		for _, v := range vs {
			if v != nil {
				v.Close()
			}
		}
	}()
	err = eachNode(len(gids), parallel, func(i int) error {
		g := gids[i]
		v, err := n.Connect(ctx, g)
		if err != nil {
			return fmt.Errorf("gid %d: %w", g, err)
		}
		vs[i] = v
		hb := make([]byte, hdrLen)
		if err := v.Read(ctx, hb, "mem", 0); err != nil {
			return fmt.Errorf("gid %d: %w", g, err)
		}
		if hs[i], err = parseHeader(hb); err != nil {
			return fmt.Errorf("gid %d: %w", g, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	t2 := time.Now()
	r.ConnectUs = us(t2.Sub(t1))
	v, reads, err := lookup(ctx, func(ctx context.Context, i int, p []byte, off uint64) error {
		return vs[i].Read(ctx, p, "mem", off)
	}, hs, key)
	if err != nil {
		return err
	}
	r.found(t2, v, reads)
	return nil
}

// bootFiles is the same client on the files of the host's krfs mount:
// one open file (a VQP of the daemon) per memory node.
func bootFiles(mount string, gids []uint32, key []byte, r *result, t1 time.Time, parallel bool) error {
	if mount == "" {
		return errors.New("-mode files needs -mount")
	}
	fs := make([]*os.File, len(gids))
	hs := make([]header, len(gids))
	defer func() {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}()
	err := eachNode(len(gids), parallel, func(i int) error {
		g := gids[i]
		f, err := os.OpenFile(fmt.Sprintf("%s/peers/%d/mem", mount, g), os.O_RDWR, 0)
		if err != nil {
			return err
		}
		fs[i] = f
		hb := make([]byte, hdrLen)
		if _, err := f.ReadAt(hb, 0); err != nil {
			return err
		}
		if hs[i], err = parseHeader(hb); err != nil {
			return fmt.Errorf("gid %d: %w", g, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	t2 := time.Now()
	r.ConnectUs = us(t2.Sub(t1))
	v, reads, err := lookup(context.Background(), func(_ context.Context, i int, p []byte, off uint64) error {
		_, err := fs[i].ReadAt(p, int64(off))
		return err
	}, hs, key)
	if err != nil {
		return err
	}
	r.found(t2, v, reads)
	return nil
}

// rcPeer is an RC QP to one memory node (with its own CQ and landing
// area) and its default region's rkey.
type rcPeer struct {
	qp    verbs.QP
	cq    verbs.CQ
	local []byte // this peer's part of the registered buffer
	loff  uint64
	rkey  uint32
	wcs   [1]verbs.WC
}

// rcChunk is each peer's landing area in the registered buffer.
const rcChunk = 64 << 10

func bootRC(ctx context.Context, dev verbs.Device, cl *meta.Client, gids []uint32, key []byte, r *result, t1 time.Time, parallel bool) error {
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	local := make([]byte, rcChunk*len(gids))
	lmr, err := pd.RegMR(local, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	read := func(pr *rcPeer, rkey uint32, p []byte, off uint64) error {
		if len(p) > rcChunk {
			return errors.New("read too large")
		}
		if err := pr.qp.PostSend([]verbs.SendWR{{Op: verbs.OpRead, Flags: verbs.Signaled,
			Local: verbs.SGE{MR: lmr, Offset: pr.loff, Length: uint32(len(p))}, RemoteAddr: off, RKey: rkey}}); err != nil {
			return err
		}
		for pr.cq.Poll(pr.wcs[:]) == 0 {
			if err := pr.cq.Wait(ctx); err != nil {
				return err
			}
		}
		if err := pr.wcs[0].Err(); err != nil {
			return err
		}
		copy(p, pr.local)
		return nil
	}
	peers := make([]*rcPeer, len(gids))
	hs := make([]header, len(gids))
	lookupNs := make([]int64, len(gids))
	defer func() {
		for _, pr := range peers {
			if pr != nil {
				pr.qp.Destroy()
			}
		}
	}()
	// Per memory node: the meta lookup, an RC QP created and connected
	// from scratch (CM handshake), the directory READ that finds the
	// default region's rkey, the header READ.
	err = eachNode(len(gids), parallel, func(i int) error {
		g := gids[i]
		t0 := time.Now()
		info, err := cl.Lookup(ctx, g)
		if err != nil {
			return fmt.Errorf("gid %d: %w", g, err)
		}
		lookupNs[i] = int64(time.Since(t0))
		cq, err := dev.CreateCQ(16)
		if err != nil {
			return err
		}
		q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq, RecvCQ: cq, Caps: verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 1}})
		if err != nil {
			return err
		}
		pr := &rcPeer{qp: q, cq: cq, local: local[i*rcChunk : (i+1)*rcChunk], loff: uint64(i * rcChunk)}
		peers[i] = pr
		if _, err := dev.ConnectRC(ctx, q, info.Addr, qpcoreRCService, verbs.ConnParams{}); err != nil {
			return fmt.Errorf("RC to gid %d: %w", info.GID, err)
		}
		dir := make([]byte, info.DirLen)
		if err := read(pr, info.DirRKey, dir, 0); err != nil {
			return fmt.Errorf("gid %d directory: %w", info.GID, err)
		}
		if pr.rkey, err = dirLookup(dir, "mem"); err != nil {
			return fmt.Errorf("gid %d: %w", info.GID, err)
		}
		hb := make([]byte, hdrLen)
		if err := read(pr, pr.rkey, hb, 0); err != nil {
			return fmt.Errorf("gid %d: %w", info.GID, err)
		}
		if hs[i], err = parseHeader(hb); err != nil {
			return fmt.Errorf("gid %d: %w", info.GID, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var sum int64
	for _, d := range lookupNs {
		sum += d
	}
	r.LookupsUs = float64(sum) / 1e3 // summed over the nodes (they overlap with -parallel)
	t3 := time.Now()
	r.ConnectUs = us(t3.Sub(t1))
	v, reads, err := lookup(ctx, func(ctx context.Context, i int, p []byte, off uint64) error {
		return read(peers[i], peers[i].rkey, p, off)
	}, hs, key)
	if err != nil {
		return err
	}
	r.found(t3, v, reads)
	return nil
}

// dirLookup finds a region's rkey in a region directory, as documented in
// package qpcore: a 64-byte header (magic "KRD1", record length, format,
// capacity), then records of rkey, length, flags, name.
func dirLookup(dir []byte, name string) (uint32, error) {
	le := binary.LittleEndian
	if len(dir) < 64 || le.Uint32(dir) != 0x3144524b {
		return 0, errors.New("not a region directory")
	}
	recLen, capacity := int(le.Uint16(dir[4:])), int(le.Uint32(dir[8:]))
	for i := range capacity {
		rec := dir[64+i*recLen:]
		if len(rec) < recLen || recLen < 76 {
			break
		}
		seqHead, seqTail := le.Uint32(rec), le.Uint32(rec[76:])
		if rec[17]&1 == 0 || seqHead != seqTail || seqHead%2 != 0 {
			continue
		}
		if nl := int(rec[18]); nl <= 32 && string(rec[32:32+nl]) == name {
			return le.Uint32(rec[4:]), nil
		}
	}
	return 0, fmt.Errorf("no region %q", name)
}

// coldPeer: per iteration and memory node, forget the peer, then time a
// cold Connect + first 8-byte READ, then one warm 8-byte READ. With
// -echo, each iteration is followed by the same pattern in raw UDP: one
// round trip to the meta service's host and one to the memory node's
// host (the cold pair), then one more to the memory node's host (the
// warm one), each to an echo server whose thread slept since its last
// turn, as the meta service's and the peer's did.
func coldPeer(ctx context.Context, dev verbs.Device, cl *meta.Client, gids []uint32, iters int) error {
	var ping *baseline.Pinger
	if len(echoes) > 0 {
		if len(echoes) != len(gids)+1 {
			return fmt.Errorf("-echo: want %d addresses (the meta host's, then one per node), got %d", len(gids)+1, len(echoes))
		}
		var err error
		if ping, err = (baseline.Host{Addr: dev.Addr().Addr()}).NewPinger(8); err != nil {
			return err
		}
		defer ping.Close()
	}
	var ucold, uwarm []time.Duration
	n, err := qpcore.NewNode(dev, cl, coreCfg)
	if err != nil {
		return err
	}
	defer n.Close()
	b := make([]byte, 8)
	if err := n.Register(b); err != nil {
		return err
	}
	var cold, conn, first, warm []time.Duration
	for k := range iters {
		g := gids[k%len(gids)]
		if !n.Forget(g) {
			return fmt.Errorf("gid %d still in use", g)
		}
		t0 := time.Now()
		v, err := n.Connect(ctx, g)
		tc := time.Now()
		if err == nil {
			err = v.Read(ctx, b, "mem", 0)
		}
		t1 := time.Now()
		if err == nil {
			err = v.Read(ctx, b, "mem", 0)
		}
		t2 := time.Now()
		if err != nil {
			return fmt.Errorf("gid %d: %w", g, err)
		}
		v.Close()
		cold, warm = append(cold, t1.Sub(t0)), append(warm, t2.Sub(t1))
		conn, first = append(conn, tc.Sub(t0)), append(first, t1.Sub(tc))
		if ping != nil {
			peer := echoes[1+k%len(gids)]
			m, err := ping.RoundTrip(echoes[0])
			if err != nil {
				return err
			}
			c, err := ping.RoundTrip(peer)
			if err != nil {
				return err
			}
			w, err := ping.RoundTrip(peer)
			if err != nil {
				return err
			}
			ucold, uwarm = append(ucold, m+c), append(uwarm, w)
		}
	}
	p50 := func(d []time.Duration) float64 { slices.Sort(d); return us(d[len(d)/2]) }
	c, w := p50(cold), p50(warm)
	out := map[string]any{"mode": "coldpeer", "iterations": iters,
		"cold_connect_read8_p50_us": c, "connect_p50_us": p50(conn), "first_read8_p50_us": p50(first),
		"warm_read8_p50_us": w, "ratio": c / w, "target": 2.3}
	if ping != nil {
		uc, uw := p50(ucold), p50(uwarm)
		out["udp_cold_pair_p50_us"], out["udp_warm_p50_us"], out["udp_ratio"] = uc, uw, uc/uw
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
