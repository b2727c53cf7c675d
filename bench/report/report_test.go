package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/bench/baseline"
)

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
	sweep := &bench.Report{Test: "read_lat", Mode: "api"}
	for _, n := range []int{8, 16, 32} {
		sweep.AddLat(bench.LatTitle("read_lat"), bench.NewLatRow("", n, lat))
		sweep.Baselines = append(sweep.Baselines, bench.BaseRow{Bytes: n, Baseline: 4})
	}
	var buf bytes.Buffer
	sweep.Write(&buf, true)
	os.WriteFile(filepath.Join(raw, "api_sweep.json"), buf.Bytes(), 0o644)
	var out bytes.Buffer
	if err := Dir(dir, &out); err != nil {
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
