package qpcore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/bench/baseline"
	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/internal/vethpair"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// TestVethBench measures the Go API across a real 1500-byte veth between
// two network namespaces, each side in its own process, against baselines
// on the same veth in the same run: 8 B READ p50 vs a raw UDP ping-pong,
// 1 MiB READs with 4 outstanding vs TCP request/response at depth 4, and
// the FUSE floor (a go-fuse file in its own process whose read makes one
// UDP round trip): p50 and rate with 32 threads. It also checks that no IP
// fragment was created. It is a measurement, not a test: it runs only
// with KRFS_VETH_BENCH=1 (as root) and reports with t.Log.
//
// KRFS_NODRIVE=1 turns run-to-completion off in the requester;
// KRFS_PEER_GOMAXPROCS sets the responder's GOMAXPROCS.
func TestVethBench(t *testing.T) {
	switch os.Getenv("KRFS_VETH_ROLE") {
	case "responder":
		vethResponder(t)
		return
	case "floor":
		vethFloor(t)
		return
	}
	if os.Getenv("KRFS_VETH_BENCH") == "" {
		t.Skip("a measurement: set KRFS_VETH_BENCH=1 (needs root)")
	}
	p := vethpair.New(t, 1500)
	frag0 := [2]uint64{}
	for i := range frag0 {
		frag0[i], _ = p.FragCreates(i)
	}

	// The responder: a softnic device and a qpcore node exporting "mem" on
	// host B, plus the baseline servers.
	var peer struct {
		Info     meta.NodeInfo
		UDP, TCP netip.AddrPort
	}
	stopPeer := startChild(t, p.Names[1], "responder", map[string]string{
		"KRFS_VETH_ADDR": p.AddrB.String(),
		"GOMAXPROCS":     os.Getenv("KRFS_PEER_GOMAXPROCS"),
	}, &peer)
	defer stopPeer()

	// The requester: this process, its socket on host A.
	var dev *softnic.Device
	if err := p.Do(0, func() (err error) {
		dev, err = softnic.OpenUDP(netip.AddrPortFrom(p.AddrA, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	res := newResolver(clock.System{})
	res.set(peer.Info)
	n, err := qpcore.NewNode(dev, res, qpcore.Config{GID: 1, NoDrive: os.Getenv("KRFS_NODRIVE") != ""})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	v, err := n.Connect(ctx, peer.Info.GID)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()

	const latN = 20000
	buf := make([]byte, 8)
	for range 200 {
		if err := v.Read(ctx, buf, "mem", 0); err != nil {
			t.Fatal(err)
		}
	}
	lat := make(baseline.Latencies, 0, latN)
	st0 := dev.Stats()
	for range latN {
		t0 := time.Now()
		if err := v.Read(ctx, buf, "mem", 0); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	st1 := dev.Stats()
	t.Logf("requester system calls per 8 B READ: %.2f receive, %.2f send",
		float64(st1.RxSyscalls-st0.RxSyscalls)/latN, float64(st1.TxSyscalls-st0.TxSyscalls)/latN)
	var ping baseline.Latencies
	if err := p.Do(0, func() (err error) {
		ping, err = baseline.Host{Addr: p.AddrA}.UDPPingPongTo(peer.UDP, latN, 8)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ls, ps := lat.Summary(), ping.Summary()
	t.Logf("8 B READ p50 %.1f us, raw UDP ping-pong p50 %.1f us: %.2fx (target <= 1.3x)",
		us(ls.Typical), us(ps.Typical), baseline.Ratio(ls.Typical, ps.Typical))

	// 1 MiB READs, 4 outstanding: four goroutines of synchronous READs.
	const mib = 1 << 20
	const bwOps = 400
	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = make([]byte, mib)
	}
	var next sync.WaitGroup
	start := time.Now()
	var mu sync.Mutex
	var bwErr error
	per := bwOps / len(bufs)
	for i := range bufs {
		next.Add(1)
		go func() {
			defer next.Done()
			for range per {
				if err := v.Read(ctx, bufs[i], "mem", 0); err != nil {
					mu.Lock()
					bwErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	next.Wait()
	if bwErr != nil {
		t.Fatal(bwErr)
	}
	rate := float64(per*len(bufs)*mib) / time.Since(start).Seconds()
	var tcp float64
	if err := p.Do(0, func() (err error) {
		tcp, err = baseline.TCPBandwidthTo(peer.TCP, mib, int64(bwOps)*mib, 4)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("1 MiB READ x4 %.0f MiB/s, TCP request/response depth 4 %.0f MiB/s: %.2fx (target >= 0.9x)",
		rate/mib, tcp/mib, rate/tcp)
	s := n.Stats()
	t.Logf("registration cache: %d entries, %d bytes; device: misplaced %d, retransmits %d",
		s.MemCached, s.MemCachedBytes, dev.Stats().Misplaced, dev.Stats().Retransmits)

	// The FUSE floor in its own process on host A.
	if os.Getenv("KRFS_VETH_FLOOR") != "" {
		var floor struct{ Path string }
		stopFloor := startChild(t, p.Names[0], "floor", map[string]string{
			"KRFS_VETH_ADDR": p.AddrA.String(), "KRFS_VETH_ECHO": peer.UDP.String(),
			"GOMAXPROCS": os.Getenv("KRFS_PEER_GOMAXPROCS"),
		}, &floor)
		fl, err := baseline.PreadLatency(floor.Path, 5000, 8)
		if err != nil {
			t.Fatal(err)
		}
		fr, err := baseline.PreadRate(floor.Path, 32, 8, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("FUSE floor: 8 B pread p50 %.1f us, 32 threads %.0f preads/s", us(fl.Summary().Typical), fr)
		stopFloor()
	}

	for i := range frag0 {
		f, _ := p.FragCreates(i)
		if f != frag0[i] {
			t.Errorf("host %d: Ip FragCreates %d -> %d", i, frag0[i], f)
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// startChild re-executes this test binary in namespace ns with
// KRFS_VETH_ROLE=role, decodes the JSON line it prints into out, and
// returns a function that stops it (closing its stdin).
func startChild(t *testing.T, ns, role string, env map[string]string, out any) func() {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, exe, "-test.run=^TestVethBench$", "-test.v")
	cmd.Env = append(os.Environ(), "KRFS_VETH_ROLE="+role)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if env[k] != "" {
			cmd.Env = append(cmd.Env, k+"="+env[k])
		}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) > 0 && line[0] == '{' {
			if err := json.Unmarshal(line, out); err != nil {
				t.Fatalf("%s: %v", role, err)
			}
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return func() {
		stdin.Close()
		cmd.Wait()
	}
}

// childWait blocks until the parent closes stdin.
func childWait() {
	b := make([]byte, 1)
	for {
		if _, err := os.Stdin.Read(b); err != nil {
			return
		}
	}
}

func vethResponder(t *testing.T) {
	a := netip.MustParseAddr(os.Getenv("KRFS_VETH_ADDR"))
	dev, err := softnic.OpenUDP(netip.AddrPortFrom(a, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	n, err := qpcore.NewNode(dev, newResolver(clock.System{}), qpcore.Config{GID: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Export("mem", verbs.PageAligned(1<<20), verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	srv, err := baseline.StartRemoteServer(a, 0, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	b, _ := json.Marshal(map[string]any{"Info": n.Info(), "UDP": srv.UDPAddr(), "TCP": srv.TCPAddr()})
	fmt.Printf("%s\n", b)
	childWait()
}

func vethFloor(t *testing.T) {
	a := netip.MustParseAddr(os.Getenv("KRFS_VETH_ADDR"))
	echo := netip.MustParseAddrPort(os.Getenv("KRFS_VETH_ECHO"))
	stop := make(chan struct{})
	go func() { childWait(); close(stop) }()
	err := baseline.ServeFUSEFloor(t.TempDir(), a, echo, 1<<20, func(path string) {
		b, _ := json.Marshal(map[string]string{"Path": path})
		fmt.Printf("%s\n", b)
	}, stop)
	if err != nil {
		t.Fatal(err)
	}
}
