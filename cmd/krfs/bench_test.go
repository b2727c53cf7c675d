package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/baseline"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

func TestBenchArgs(t *testing.T) {
	o, err := parseBenchArgs([]string{"--meta", "127.0.0.1:4791", "read_lat", "--gid", "3", "-s", "4K", "-n", "10"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.test != "read_lat" || o.size != 4096 || o.iters != 10 || o.gid != 3 || !o.apiMode() {
		t.Errorf("parsed %+v", o)
	}
	o, err = parseBenchArgs([]string{"read_bw", "--path", "/mnt/k/peers/1/mem", "-a", "-t", "8"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.sizes(); len(got) != 18 || got[0] != 8 || got[17] != 1<<20 {
		t.Errorf("sweep sizes %v", got)
	}
	if o.iters != 5000 || o.itersFor(1<<20) != 256 || o.itersFor(8) != 5000 || o.mode() != "file" {
		t.Errorf("iterations %d %d %d", o.iters, o.itersFor(1<<20), o.itersFor(8))
	}
	o, _ = parseBenchArgs([]string{"read_bw", "--path", "f"}, io.Discard)
	if o.size != 1<<20 {
		t.Errorf("read_bw default size %d", o.size)
	}
	o, _ = parseBenchArgs([]string{"atomic_lat", "--path", "f"}, io.Discard)
	if o.size != 8 || o.iters != 1000 {
		t.Errorf("atomic defaults %d %d", o.size, o.iters)
	}
	for _, bad := range [][]string{
		{},
		{"read_lat"},                           // no mode
		{"nope", "--path", "f"},                // unknown test
		{"read_lat", "read_bw", "--path", "f"}, // two tests
		{"read_lat", "--path", "f", "--meta", "127.0.0.1:1", "--gid", "1"},
		{"read_lat", "--meta", "127.0.0.1:1"},     // no gid
		{"read_lat", "--path", "f", "--gid", "2"}, // gid in file mode
		{"meta_lookup", "--path", "f"},
		{"fullmesh", "--path", "f"},
		{"read_lat", "--path", "f", "-t", "4"},
		{"read_bw", "--path", "f", "-t", "0"},
		{"atomic_lat", "--path", "f", "-s", "16"},
		{"atomic_lat", "--path", "f", "-a"},
		{"connect", "--path", "f", "-s", "8"},
		{"read_lat", "--path", "f", "-s", "8", "-a"},
		{"read_lat", "--path", "f", "-s", "1X"},
		{"read_lat", "--path", "f", "-n", "5", "-D", "1"},
		{"read_lat", "--path", "f", "--progress", "maybe"},
		{"fuse_noop_lat", "--path", "f"},
		{"read_lat", "--path", "f", "--transport", "rc"},
		{"read_lat", "--meta", "127.0.0.1:1", "--gid", "1", "--transport", "ud"},
	} {
		if _, err := parseBenchArgs(bad, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
	var stderr bytes.Buffer
	if code := run([]string{"krfs", "bench", "read_lat"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--meta HOST:PORT --gid N") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestBenchTables(t *testing.T) {
	var lat baseline.Latencies
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Microsecond)
	}
	r := &benchReport{Test: "read_lat", Mode: "api", Target: "x"}
	r.addLat(latTitle("read_lat"), newLatRow("", 8, lat))
	r.addLat(latTitle("read_lat"), newLatRow("", 16, lat))
	r.Baselines = []baseRow{{Bytes: 8, Name: "udp_pingpong p50", Unit: "usec", Krfs: 50.5, Baseline: 10, Ratio: 5.05}}
	var out bytes.Buffer
	r.write(&out, false)
	s := out.String()
	for _, want := range []string{baseline.LatencyHeader, lat.Summary().Row(8), lat.Summary().Row(16), "ratio 5.05x"} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	if len(r.Tables) != 1 || r.Tables[0].Rows[1].P99Us != 99 || r.Tables[0].Rows[0].TypicalUs != 50.5 {
		t.Errorf("rows %+v", r.Tables)
	}
	out.Reset()
	r.write(&out, true)
	var back benchReport
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || back.Tables[0].Rows[0].P999Us != 100 {
		t.Errorf("json %v: %s", err, out.String())
	}

	// 100 completions of 1 MiB, one every ms, then 10 more in 1 ms.
	var done []time.Duration
	for i := 1; i <= 100; i++ {
		done = append(done, time.Duration(i)*time.Millisecond)
	}
	for i := 1; i <= 10; i++ {
		done = append(done, 100*time.Millisecond+time.Duration(i)*100*time.Microsecond)
	}
	row := newBWRow(1<<20, done, 1)
	if row.Iterations != 110 || math.Abs(row.AvgMiBs-110/0.101) > 0.01 || row.PeakMiBs != 5500 || math.Abs(row.MsgRateMpps-row.AvgMiBs/1e6) > 1e-9 {
		t.Errorf("bw row %+v", row)
	}
	if !strings.HasPrefix(row.String(), " 1048576    110") {
		t.Errorf("bw line %q", row.String())
	}
	if !strings.Contains(BWHeader, "BW peak[MiB/sec]") || !strings.Contains(BWHeader, "MsgRate[Mpps]") {
		t.Error("header")
	}
}

// benchCluster is one node exporting "mem" with an embedded meta service,
// registered under an assigned gid: what `krfs mount` runs.
func benchCluster(t *testing.T) (metaAddr string, gid uint32) {
	dev, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := meta.NewServer(dev, meta.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := meta.NewClient(ctx, dev, meta.ClientConfig{Servers: []netip.AddrPort{dev.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := qpcore.NewNode(dev, cl, qpcore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Export("mem", make([]byte, 1<<16), verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	ag, err := cl.Register(ctx, n.Info(), meta.AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	n.SetGID(ag.Info().GID)
	t.Cleanup(func() {
		ag.Close()
		n.Close()
		cl.Close()
		srv.Close()
		dev.Close()
	})
	return dev.Addr().String(), ag.Info().GID
}

func TestBenchAPIReadLat(t *testing.T) {
	addr, gid := benchCluster(t)
	var stdout, stderr bytes.Buffer
	args := []string{"bench", "read_lat", "--meta", addr, "--gid", strconv.Itoa(int(gid)), "-s", "64", "-n", "300", "--json", "--baseline"}
	if code := run(append([]string{"krfs"}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var r benchReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(r.Tables) != 1 || len(r.Tables[0].Rows) != 1 {
		t.Fatalf("tables %+v", r.Tables)
	}
	row := r.Tables[0].Rows[0]
	if row.Bytes != 64 || row.Iterations != 300 || row.MinUs <= 0 || row.TypicalUs < row.MinUs || row.MaxUs < row.P999Us {
		t.Errorf("row %+v", row)
	}
	if len(r.Baselines) != 1 || r.Baselines[0].Baseline <= 0 || r.Baselines[0].Ratio <= 0 {
		t.Errorf("baselines %+v", r.Baselines)
	}
	t.Logf("64 B READ p50 %.2f us, UDP ping-pong %.2f us", row.TypicalUs, r.Baselines[0].Baseline)

	// The other API tests, briefly, in table form.
	for _, a := range [][]string{
		{"write_lat", "-s", "8", "-n", "50"},
		{"atomic_lat", "-n", "50"},
		{"read_bw", "-s", "4K", "-t", "8", "-n", "200"},
		{"write_bw", "-a", "-n", "20", "-t", "2"},
		{"connect", "-n", "20"},
		{"meta_lookup", "-n", "20"},
		{"fullmesh", "-n", "5"},
		{"read_bw", "-s", "8", "-t", "4", "-n", "100", "--transport", "rc"},
	} {
		stdout.Reset()
		stderr.Reset()
		args := append([]string{"krfs", "bench", "--meta", addr, "--gid", strconv.Itoa(int(gid))}, a...)
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%q: exit %d: %s", a, code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "#iterations") {
			t.Errorf("%q: no table:\n%s", a, stdout.String())
		}
		if slices.Contains(a, "rc") && !strings.Contains(stdout.String(), "transport at the end: rc") {
			t.Errorf("--transport rc did not end on RC:\n%s", stdout.String())
		}
		if a[0] == "write_bw" && !strings.Contains(stdout.String(), "131072 bytes skipped") {
			t.Errorf("sizes past the region not reported:\n%s", stdout.String())
		}
	}
}

const sampleGoBench = `goos: linux
BenchmarkReadLatency8B-2     	   20000	     51998 ns/op	        14.00 p50-us	        10.00 udp-p50-us	         1.4 x-udp-p50(target<=1.25)
BenchmarkQPCoreMemory-2        	       1	  79935662 ns/op	       -21.30 heap-B/peer	        10.33 heap-MiB-10000peers	         6.289 heap-MiB-1000peers	        10.43 heap-MiB-5000peers	      8765 rc-mesh-B/peer	         4.312 rss-MiB-10000peers
BenchmarkMetaOneSidedVsRPC/udp/clients=8-2          	       1	  74259573 ns/op	     45994 onesided-ops/s	         3.269 onesided/rpc	      14069 rpc-ops/s
PASS
`

func TestBenchReportDir(t *testing.T) {
	m := parseGoBench(strings.NewReader(sampleGoBench))
	if m["BenchmarkReadLatency8B"]["p50-us"] != 14 || m["BenchmarkMetaOneSidedVsRPC/udp/clients=8"]["rpc-ops/s"] != 14069 || len(m) != 3 {
		t.Fatalf("parsed %v", m)
	}
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw")
	os.Mkdir(raw, 0o755)
	os.WriteFile(filepath.Join(raw, "x.txt"), []byte(sampleGoBench), 0o644)
	var lat baseline.Latencies
	for i := 1; i <= 10; i++ {
		lat = append(lat, time.Duration(i)*time.Microsecond)
	}
	sweep := &benchReport{Test: "read_lat", Mode: "api"}
	for _, n := range []int{8, 16, 32} {
		sweep.addLat(latTitle("read_lat"), newLatRow("", n, lat))
		sweep.Baselines = append(sweep.Baselines, baseRow{Bytes: n, Baseline: 4})
	}
	var buf bytes.Buffer
	sweep.write(&buf, true)
	os.WriteFile(filepath.Join(raw, "api_sweep.json"), buf.Bytes(), 0o644)
	var out bytes.Buffer
	if err := benchReportDir(dir, &out); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	if string(md) != out.String() {
		t.Error("printed and written markdown differ")
	}
	for _, want := range []string{"**MISSED**", "| softnic verbs READ (in-process) | p50 us | 14.0 | raw-syscall UDP ping-pong | 10.0 | 1.4x |", "| 16 | 5.50 | — | — | 4.00 |", "latency_vs_size.svg", "memory_vs_peers.svg", "Not measured in this run"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	var res suiteResults
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &res); err != nil || len(res.Rows) == 0 || res.GoBench["BenchmarkQPCoreMemory"]["rc-mesh-B/peer"] != 8765 {
		t.Errorf("results.json: %v %+v", err, res.Rows)
	}
	for _, p := range []string{"latency_vs_size.svg", "memory_vs_peers.svg"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Error(err)
		}
	}
}

func TestBenchFuseNoop(t *testing.T) {
	if os.Geteuid() != 0 || checkFUSE() != nil {
		t.Skip("needs root and /dev/fuse")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"krfs", "bench", "fuse_noop_lat", "-s", "4K", "-n", "200", "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var r benchReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || len(r.Tables) != 1 || r.Tables[0].Rows[0].Iterations != 200 || r.Tables[0].Rows[0].Bytes != 4096 {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), "krfs-bench-noop") {
		t.Error("no-op filesystem still mounted")
	}
}
