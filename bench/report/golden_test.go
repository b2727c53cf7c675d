package report

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/bench/baseline"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current code")

// goldenRun is one raw/ directory the golden test feeds to Dir.
type goldenRun struct {
	name   string
	goText string                   // raw/go.txt
	krfs   map[string]*bench.Report // raw/NAME.json
	kv     string                   // raw/extra.kv
}

// latReport is a krfs bench report with one latency table per p50 (in
// us) and baselines of the given values.
func latReport(test string, p50s []float64, bases ...float64) *bench.Report {
	r := &bench.Report{Test: test, Mode: "api"}
	for i, p := range p50s {
		r.AddLat(fmt.Sprintf("table %d", i), bench.NewLatRow("", 8, baseline.Latencies{time.Duration(p * float64(time.Microsecond))}))
	}
	for _, b := range bases {
		r.Baselines = append(r.Baselines, bench.BaseRow{Bytes: 8, Name: "base of " + test, Baseline: b})
	}
	return r
}

// bwReport is a krfs bench report with one bandwidth row.
func bwReport(test string, outstanding int, mibs, mpps float64, bases ...float64) *bench.Report {
	r := &bench.Report{Test: test, Mode: "fuse", Outstanding: outstanding, Bandwidth: []bench.BWRow{{Bytes: 1 << 20, AvgMiBs: mibs, MsgRateMpps: mpps}}}
	for _, b := range bases {
		r.Baselines = append(r.Baselines, bench.BaseRow{Bytes: 1 << 20, Name: "base of " + test, Baseline: b})
	}
	return r
}

// fullGoBench has every metric a row reads.
const fullGoBench = `BenchmarkQPCoreConnect-2 1 1 ns/op 1.5 warm-p50-us 40 rc-p50-us 18 cold-p50-us 15 read-p50-us
BenchmarkTCPConnectRoundTrip-2 1 1 ns/op 77 p50-us
BenchmarkMetaOneSidedVsRPC/udp/clients=1-2 1 1 ns/op 30000 onesided-ops/s 20000 rpc-ops/s
BenchmarkMetaOneSidedVsRPC/udp/clients=8-2 1 1 ns/op 45994 onesided-ops/s 14069 rpc-ops/s
BenchmarkReadLatency8B-2 1 1 ns/op 14 p50-us 10 udp-p50-us
BenchmarkQPCoreRead-2 1 1 ns/op 12 read-p50-us 10 udp-pingpong-p50-us
BenchmarkReadRate32-2 1 1 ns/op 200 kops/s 243 echo-kops/s
BenchmarkReadBandwidth1M-2 1 1 ns/op 3.1 GB/s 5.0 tcp-GB/s
BenchmarkQPCoreMemory-2 1 1 ns/op -21.3 heap-B/peer 10.33 heap-MiB-10000peers 6.289 heap-MiB-1000peers 10.43 heap-MiB-5000peers 8765 rc-mesh-B/peer 4.312 rss-MiB-10000peers
BenchmarkQPCoreFullMesh240-2 1 1 ns/op 120 dc-connect-ms 300 dc-connect+read-ms 9000 rc-connect-ms
BenchmarkQPCoreFullMeshSweep/N=16-2 1 1 ns/op 2 dc-connect-ms 5 dc-connect+read-ms 40 rc-connect-ms
BenchmarkQPCoreFullMeshSweep/N=64-2 1 1 ns/op 20 dc-connect-ms 50 dc-connect+read-ms 700 rc-connect-ms
BenchmarkQPCoreElasticStart-2 1 1 ns/op 9 krfs-ms 45 rc-ms
`

func goldenRuns() []goldenRun {
	full := map[string]*bench.Report{
		"api_connect":                 latReport("connect", []float64{3, 20, 35}, 77),
		"fuse_connect":                latReport("connect", []float64{40}, 77),
		"api_meta_lookup":             latReport("meta_lookup", []float64{14, 30}),
		"fuse_read_lat8":              latReport("read_lat", []float64{52}, 11),
		"fuse_noop_lat8":              latReport("fuse_noop_lat", []float64{11}, 10),
		"api_read_lat8":               latReport("read_lat", []float64{16}, 10.5),
		"api_atomic_lat":              latReport("atomic_lat", []float64{17}, 10.5),
		"fuse_atomic_lat":             latReport("atomic_lat", []float64{30}, 10.5),
		"api_write_lat8":              latReport("write_lat", []float64{16.5}, 10.5),
		"fuse_write_lat8":             latReport("write_lat", []float64{28}, 10.5),
		"api_send_lat":                latReport("send_lat", []float64{25}, 10.5),
		"fuse_send_lat":               latReport("send_lat", []float64{45}, 10.5),
		"api_rate32":                  bwReport("read_bw", 32, 1.5, 0.18, 243),
		"fuse_rate32":                 bwReport("read_bw", 32, 0.6, 0.07, 243),
		"api_hybrid_dc":               bwReport("read_bw", 32, 1, 0.12),
		"api_hybrid_rc":               bwReport("read_bw", 32, 1, 0.15),
		"api_bw1m":                    bwReport("read_bw", 4, 3000, 0.003, 4000),
		"fuse_bw1m":                   bwReport("read_bw", 4, 2500, 0.002, 4000),
		"veth_api_read_lat8":          latReport("read_lat", []float64{26}, 20),
		"veth_api_connect":            latReport("connect", []float64{3, 60, 100}, 80),
		"veth_fuse_read_lat8":         latReport("read_lat", []float64{75}, 50),
		"veth_fuse_rate32":            bwReport("read_bw", 32, 0, 0.09),
		"veth_base_floor_rate32":      bwReport("floor", 32, 0, 0.1),
		"veth_api_bw1m":               bwReport("read_bw", 4, 1800, 0),
		"veth_fuse_bw1m":              bwReport("read_bw", 4, 1000, 0),
		"veth_base_tcp1m":             bwReport("tcp", 4, 2000, 0),
		"veth_base_tcp1m_fuse":        bwReport("tcp", 4, 2000, 0),
		"veth_api_wbw1m":              bwReport("write_bw", 4, 1700, 0),
		"veth_fuse_wbw1m":             bwReport("write_bw", 4, 900, 0),
		"veth_base_tcp1m_w":           bwReport("tcp", 4, 2000, 0),
		"veth_fuse_read_lat8_udp":     latReport("read_lat", []float64{40}, 22),
		"veth_dev_fuse_read_lat8_udp": latReport("read_lat", []float64{75}, 22),
		"veth_fuse_rate32_b":          bwReport("read_bw", 32, 0, 0.03),
		"veth_dev_fuse_rate32":        bwReport("read_bw", 32, 0, 0.015),
		"veth_dev_fuse_bw1m":          bwReport("read_bw", 4, 900, 0),
	}
	sweep := func(test string, base float64) *bench.Report {
		r := &bench.Report{Test: test, Mode: "api"}
		for i, n := range []int{8, 64, 4096} {
			r.AddLat(bench.LatTitle("read_lat"), bench.NewLatRow("", n, baseline.Latencies{time.Duration(10+i) * time.Microsecond}))
			r.Baselines = append(r.Baselines, bench.BaseRow{Bytes: n, Baseline: base + float64(i)})
		}
		return r
	}
	full["api_sweep"], full["fuse_sweep"], full["fuse_noop_sweep"] = sweep("read_lat", 9), sweep("read_lat", 9), sweep("fuse_noop_lat", 9)
	// A partial run: some figures missing, some reports without tables.
	partial := map[string]*bench.Report{
		"api_connect":    latReport("connect", []float64{3}, 77), // too few tables
		"fuse_read_lat8": latReport("read_lat", []float64{52}, 11),
		"api_rate32":     {Test: "read_bw"}, // no bandwidth
		"api_bw1m":       bwReport("read_bw", 4, 3000, 0.003, 4000),
		"veth_api_bw1m":  bwReport("read_bw", 4, 1800, 0),
	}
	partialGo := `BenchmarkQPCoreConnect-2 1 1 ns/op 1.5 warm-p50-us 18 cold-p50-us
BenchmarkReadLatency8B-2 1 1 ns/op 14 p50-us
BenchmarkQPCoreMemory-2 1 1 ns/op 70 rss-MiB-10000peers 2000 heap-B/peer
`
	return []goldenRun{
		{name: "full", goText: fullGoBench, krfs: full,
			kv: "fio_rssanon_kib 70000\nfio_rc 1\nfrag_before_h1 5\nfrag_after_h1 5\nfrag_before_h2 7\nfrag_after_h2 9\nfrag_before_meta 1\nfrag_after_meta 1\n"},
		{name: "partial", goText: partialGo, krfs: partial, kv: "fio_rssanon_kib 1000\nfrag_before_h1 3\n"},
		{name: "empty"},
	}
}

// TestReportGolden: the rows (figures, baselines, ratios, targets,
// verdicts, sources), the missing list, the markdown and the plots of
// three runs (everything measured, a partial run, nothing) are exactly
// what testdata/*.golden hold. The golden files were written by the
// report before its rows became a table (go test -update rewrites them):
// the table changed no figure.
func TestReportGolden(t *testing.T) {
	for _, run := range goldenRuns() {
		t.Run(run.name, func(t *testing.T) {
			dir := t.TempDir()
			raw := filepath.Join(dir, "raw")
			if err := os.Mkdir(raw, 0o755); err != nil {
				t.Fatal(err)
			}
			write := func(name string, b []byte) {
				if err := os.WriteFile(filepath.Join(raw, name), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("go.txt", []byte(run.goText))
			write("extra.kv", []byte(run.kv))
			for name, r := range run.krfs {
				var buf bytes.Buffer
				if err := r.Write(&buf, true); err != nil {
					t.Fatal(err)
				}
				write(name+".json", buf.Bytes())
			}
			var out bytes.Buffer
			if err := Dir(dir, &out); err != nil {
				t.Fatal(err)
			}
			var res suiteResults
			b, err := os.ReadFile(filepath.Join(dir, "results.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatal(err)
			}
			// The header names the date and the machine: everything after
			// it must match.
			md := out.String()
			md = md[strings.Index(md, "\n\n")+2:]
			md = md[strings.Index(md, "\n\n")+2:]
			rows, _ := json.MarshalIndent(struct {
				Rows    []resultRow
				Missing []string
				Plots   []string
			}{res.Rows, res.Missing, res.Plots}, "", "  ")
			got := string(rows) + "\n---\n" + md
			for _, p := range res.Plots {
				svg, err := os.ReadFile(filepath.Join(dir, p))
				if err != nil {
					t.Fatal(err)
				}
				got += "\n--- " + p + "\n" + string(svg)
			}
			golden := filepath.Join("testdata", run.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
				for i := range max(len(gl), len(wl)) {
					var g, w string
					if i < len(gl) {
						g = gl[i]
					}
					if i < len(wl) {
						w = wl[i]
					}
					if g != w {
						t.Fatalf("%s differs from %s at line %d:\n got: %s\nwant: %s", run.name, golden, i+1, g, w)
					}
				}
			}
		})
	}
}
