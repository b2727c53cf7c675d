package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/bench/baseline"
)

// TestVethRows feeds the report what scripts/bench.sh's veth_rows leaves
// in raw/ (krfs bench and krfs-baseline reports, extra.kv) and checks
// each issue-10 row: figures, ratio and verdict.
func TestVethRows(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw")
	if err := os.Mkdir(raw, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(name string, r *bench.Report) {
		var buf bytes.Buffer
		if err := r.Write(&buf, true); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(raw, name+".json"), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The latency rows' baselines are in their own reports (krfs bench
	// --baseline-echo, --baseline-floor).
	lat := func(name string, us, base time.Duration) {
		r := &bench.Report{Test: "read_lat"}
		r.AddLat("x", bench.NewLatRow("", 8, baseline.Latencies{us * time.Microsecond}))
		r.Baselines = []bench.BaseRow{{Bytes: 8, Name: "base", Baseline: float64(base)}}
		put(name, r)
	}
	bw := func(name string, mibs, mpps float64) {
		put(name, &bench.Report{Test: "read_bw", Bandwidth: []bench.BWRow{{Bytes: 1 << 20, AvgMiBs: mibs, MsgRateMpps: mpps}}})
	}
	lat("veth_api_read_lat8", 26, 20)  // 1.3x: met
	lat("veth_fuse_read_lat8", 75, 50) // 1.5x: missed
	bw("veth_fuse_rate32", 0, 0.090)   // 0.9x: met
	bw("veth_base_floor_rate32", 0, 0.1)
	bw("veth_api_bw1m", 1800, 0)  // 0.9x: met
	bw("veth_fuse_bw1m", 1000, 0) // 0.4x: missed
	bw("veth_base_tcp1m", 2000, 0)
	bw("veth_base_tcp1m_fuse", 2500, 0) // the FUSE row's own: 0.4x
	kv := "frag_before_h1 5\nfrag_after_h1 5\nfrag_before_h2 7\nfrag_after_h2 9\nfio_rssanon_kib 70000\nfio_rc 1\nnot a line\n"
	if err := os.WriteFile(filepath.Join(raw, "extra.kv"), []byte(kv), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Dir(dir, &out); err != nil {
		t.Fatal(err)
	}
	md := out.String()
	for _, want := range []string{
		"| Go API 8 B READ, host 1 -> host 2 | p50 us | 26.0 | raw UDP ping-pong 8 B, same veth, alternating chunks | 20.0 | 1.3x |  | ratio <= 1.3 | met |",
		"| FUSE 8 B pread on host 1's mount of host 2's mem | p50 us | 75.0 | FUSE floor (go-fuse, own process, one UDP RTT per read), same veth, alternating chunks | 50.0 | 1.5x |  | ratio <= 1.2 | **MISSED** |",
		"| FUSE 8 B preads, 32 threads | kops/s | 90.0 | FUSE floor, 32 threads, same veth | 100.0 | 0.9x |  | ratio >= 0.8 | met |",
		"| Go API 1 MiB READs, 4 outstanding | MiB/s | 1800 | TCP request/response 1 MiB, depth 4, same veth | 2000 | 0.9x |  | ratio >= 0.9 | met |",
		"| FUSE 1 MiB preads, 4 outstanding | MiB/s | 1000 | TCP request/response 1 MiB, depth 4, same veth | 2500 | 0.4x |  | ratio >= 0.9 | **MISSED** |",
		"RssAnon after fio (randrw, 4 jobs, bsrange 512-1M) on a peer file (fio exited with 1: I/O errors, see raw/veth_fio.log) | MiB | 68.4 |",
		"namespace h1 during the veth rows (before 5, after 5) | fragments | 0 |  | — | — |  | 0 | met |",
		"namespace h2 during the veth rows (before 7, after 9) | fragments | 2 |  | — | — |  | 0 | **MISSED** |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "meta during the veth rows") {
		t.Error("a namespace without figures got a row")
	}
	if !strings.Contains(md, "<= 64 MiB | **MISSED** |") {
		t.Errorf("70,000 KiB of RssAnon is not reported missed:\n%s", md)
	}
}
