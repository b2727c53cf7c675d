// Package report is `krfs bench report DIR`: it reads what scripts/bench.sh
// left in DIR/raw — `go test -bench` outputs (*.txt) and `krfs bench
// --json` outputs (*.json) — and writes DIR/results.json, DIR/results.md
// (also printed) and SVG plots. Every row sets a krfs figure beside a
// baseline measured in the same run; targets are the ones stated in the
// issues.
package report

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/krfs/krfs/internal/bench"
	"github.com/krfs/krfs/internal/plot"
)

// goBench is the metrics of one benchmark line, by unit.
type goBench map[string]float64

// parseGoBench parses `go test -bench` output: name (without the
// -GOMAXPROCS suffix) to metrics.
func parseGoBench(r io.Reader) map[string]goBench {
	out := map[string]goBench{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndex(name, "-"); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		m := goBench{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			m[f[i+1]] = v
		}
		out[name] = m
	}
	return out
}

// target is a goal from the issues: ratio op value.
type target struct {
	op    string // "<=" or ">="
	value float64
}

func (t *target) String() string {
	if t == nil {
		return ""
	}
	return fmt.Sprintf("%s %g", t.op, t.value)
}

// resultRow is one line of the comparison tables.
type resultRow struct {
	Section  string  `json:"section"`
	What     string  `json:"what"`
	Unit     string  `json:"unit"`
	Krfs     float64 `json:"krfs"`
	BaseName string  `json:"baseline_name,omitempty"`
	Baseline float64 `json:"baseline,omitempty"`
	Limit    string  `json:"limit,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"` // krfs / baseline
	Target   string  `json:"target,omitempty"`
	Verdict  string  `json:"verdict,omitempty"` // met, MISSED
	Source   string  `json:"source"`
}

type suiteResults struct {
	Date      string                   `json:"date"`
	Machine   map[string]string        `json:"machine"`
	Rows      []resultRow              `json:"rows"`
	Missing   []string                 `json:"missing,omitempty"`
	GoBench   map[string]goBench       `json:"go_bench"`
	KrfsBench map[string]*bench.Report `json:"krfs_bench"`
	Extra     map[string]float64       `json:"extra,omitempty"` // raw/*.kv: "key value" lines
	Plots     []string                 `json:"plots,omitempty"`
}

type suite struct {
	res *suiteResults
}

func (s *suite) bench(name string) goBench { return s.res.GoBench[name] }

// add appends a row; ratio is computed when both figures exist.
func (s *suite) add(r resultRow, t *target) {
	if r.Baseline != 0 && r.Ratio == 0 {
		r.Ratio = r.Krfs / r.Baseline
	}
	if t != nil {
		r.Target = "ratio " + t.String()
		if r.Ratio != 0 && !math.IsNaN(r.Ratio) {
			ok := (t.op == "<=" && r.Ratio <= t.value) || (t.op == ">=" && r.Ratio >= t.value)
			r.Verdict = "met"
			if !ok {
				r.Verdict = "MISSED"
			}
		}
	}
	s.res.Rows = append(s.res.Rows, r)
}

func (s *suite) missing(what string) { s.res.Missing = append(s.res.Missing, what) }

// metric returns a go benchmark metric, recording what is missing.
func (s *suite) metric(b, unit string) (float64, bool) {
	m, ok := s.res.GoBench[b]
	if !ok {
		s.missing(b + " (not run)")
		return 0, false
	}
	v, ok := m[unit]
	if !ok {
		s.missing(b + " " + unit)
	}
	return v, ok
}

func (s *suite) krfs(name string) *bench.Report { return s.res.KrfsBench[name] }

func latP50(r *bench.Report, table int) float64 {
	if r == nil || len(r.Tables) <= table || len(r.Tables[table].Rows) == 0 {
		return 0
	}
	return r.Tables[table].Rows[0].TypicalUs
}

func firstBase(r *bench.Report) (bench.BaseRow, bool) {
	if r == nil || len(r.Baselines) == 0 {
		return bench.BaseRow{}, false
	}
	return r.Baselines[0], true
}

// Dir writes the suite's results for the runs in dir/raw into dir (see
// the package doc) and prints the markdown to stdout.
func Dir(dir string, stdout io.Writer) error {
	raw := filepath.Join(dir, "raw")
	ents, err := os.ReadDir(raw)
	if err != nil {
		return err
	}
	res := &suiteResults{Date: time.Now().UTC().Format(time.RFC3339), Machine: machineInfo(),
		GoBench: map[string]goBench{}, KrfsBench: map[string]*bench.Report{}, Extra: map[string]float64{}}
	for _, e := range ents {
		p := filepath.Join(raw, e.Name())
		switch filepath.Ext(e.Name()) {
		case ".txt":
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			for k, v := range parseGoBench(f) {
				res.GoBench[k] = v
			}
			f.Close()
		case ".json":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			var r bench.Report
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			res.KrfsBench[strings.TrimSuffix(e.Name(), ".json")] = &r
		case ".kv":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, l := range strings.Split(string(b), "\n") {
				f := strings.Fields(l)
				if len(f) != 2 {
					continue
				}
				if v, err := strconv.ParseFloat(f[1], 64); err == nil {
					res.Extra[f[0]] = v
				}
			}
		}
	}
	s := &suite{res: res}
	s.rows()
	if err := s.plots(dir); err != nil {
		return err
	}
	md := s.markdown()
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md)
	return err
}

func machineInfo() map[string]string {
	m := map[string]string{"goos": runtime.GOOS, "goarch": runtime.GOARCH, "cpus": strconv.Itoa(runtime.NumCPU()), "go": runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				m["cpu"] = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	return m
}

// rows builds the comparison tables.
func (s *suite) rows() {
	const udpLimit = "UDP ping-pong is the floor"
	// Connect.
	if w, ok := s.metric("BenchmarkQPCoreConnect", "warm-p50-us"); ok {
		rc, _ := s.metric("BenchmarkQPCoreConnect", "rc-p50-us")
		cold, _ := s.metric("BenchmarkQPCoreConnect", "cold-p50-us")
		read, _ := s.metric("BenchmarkQPCoreConnect", "read-p50-us")
		s.add(resultRow{Section: "connect", What: "VQP connect, warm (known peer) vs RC from scratch", Unit: "p50 us", Krfs: w,
			BaseName: "RC QP create + handshake", Baseline: rc, Target: "warm p50 <= 2 us; RC/warm >= 20x (ratio <= 0.05)",
			Verdict: verdict(w <= 2 && rc/w >= 20), Source: "qpcore BenchmarkQPCoreConnect (in-process)"}, nil)
		s.add(resultRow{Section: "connect", What: "VQP connect, cold (one meta READ) vs one READ", Unit: "p50 us", Krfs: cold,
			BaseName: "one 64 B READ of the meta table", Baseline: read, Limit: "one READ round trip", Source: "qpcore BenchmarkQPCoreConnect"}, &target{"<=", 1.3})
		s.add(resultRow{Section: "connect", What: "VQP connect, cold vs RC from scratch", Unit: "p50 us", Krfs: cold,
			BaseName: "RC QP create + handshake", Baseline: rc, Source: "qpcore BenchmarkQPCoreConnect"}, nil)
		if tcp, ok := s.metric("BenchmarkTCPConnectRoundTrip", "p50-us"); ok {
			s.add(resultRow{Section: "connect", What: "VQP connect, cold vs TCP connect + 1 round trip", Unit: "p50 us", Krfs: cold,
				BaseName: "TCP dial+accept+1 RTT", Baseline: tcp, Source: "qpcore + internal/baseline benchmarks"}, nil)
		}
	}
	if r := s.krfs("api_connect"); r != nil && len(r.Tables) >= 2 {
		b, _ := firstBase(r)
		s.add(resultRow{Section: "connect", What: "krfs bench connect (API, separate process, real meta): cold", Unit: "p50 us", Krfs: latP50(r, 1),
			BaseName: "TCP dial+accept+1 RTT", Baseline: b.Baseline, Source: "krfs bench connect --baseline"}, nil)
		if len(r.Tables) >= 3 {
			s.add(resultRow{Section: "connect", What: "krfs bench connect (API): cold connect + first 8 B READ", Unit: "p50 us", Krfs: latP50(r, 2),
				BaseName: "TCP dial+accept+1 RTT", Baseline: b.Baseline, Source: "krfs bench connect --baseline"}, nil)
		}
	} else {
		s.missing("api_connect")
	}
	if r := s.krfs("fuse_connect"); r != nil && len(r.Tables) >= 1 {
		b, _ := firstBase(r)
		s.add(resultRow{Section: "connect", What: "FUSE open+close of peers/GID/mem (a VQP each)", Unit: "p50 us", Krfs: latP50(r, 0),
			BaseName: "TCP dial+accept+1 RTT", Baseline: b.Baseline, Limit: "go-fuse open+close ~17-51 us (docs/machine-notes.md)", Source: "krfs bench connect --path"}, nil)
	}
	// Meta lookups.
	for _, c := range []int{1, 8} {
		name := fmt.Sprintf("BenchmarkMetaOneSidedVsRPC/udp/clients=%d", c)
		one, ok := s.metric(name, "onesided-ops/s")
		if !ok {
			continue
		}
		rpc, _ := s.metric(name, "rpc-ops/s")
		var t *target
		if c == 8 {
			t = &target{">=", 1.5}
		}
		s.add(resultRow{Section: "meta lookup", What: fmt.Sprintf("one-sided lookups, %d client(s), vs RPC", c), Unit: "lookups/s", Krfs: one,
			BaseName: "RPC lookups", Baseline: rpc, Source: "meta BenchmarkMetaOneSidedVsRPC (udp)"}, t)
	}
	if r := s.krfs("api_meta_lookup"); r != nil && len(r.Tables) == 2 {
		s.add(resultRow{Section: "meta lookup", What: "krfs bench meta_lookup (separate process): one-sided vs RPC latency", Unit: "p50 us", Krfs: latP50(r, 0),
			BaseName: "RPC lookup", Baseline: latP50(r, 1), Limit: "lower is better", Source: "krfs bench meta_lookup"}, nil)
	}
	// 8-byte READ.
	if v, ok := s.metric("BenchmarkReadLatency8B", "p50-us"); ok {
		u, _ := s.metric("BenchmarkReadLatency8B", "udp-p50-us")
		s.add(resultRow{Section: "8-byte READ", What: "softnic verbs READ (in-process)", Unit: "p50 us", Krfs: v, BaseName: "raw-syscall UDP ping-pong", Baseline: u,
			Limit: udpLimit, Source: "verbs/softnic BenchmarkReadLatency8B"}, &target{"<=", 1.25})
	}
	if v, ok := s.metric("BenchmarkQPCoreRead", "read-p50-us"); ok {
		u, _ := s.metric("BenchmarkQPCoreRead", "udp-pingpong-p50-us")
		s.add(resultRow{Section: "8-byte READ", What: "qpcore VQP READ, 64 B (in-process)", Unit: "p50 us", Krfs: v, BaseName: "raw-syscall UDP ping-pong 64 B", Baseline: u,
			Limit: udpLimit, Source: "qpcore BenchmarkQPCoreRead"}, &target{"<=", 1.3})
	}
	if r, n := s.krfs("fuse_read_lat8"), s.krfs("fuse_noop_lat8"); r != nil && n != nil {
		nb, _ := firstBase(n)
		s.add(resultRow{Section: "8-byte READ", What: "FUSE pread on peers/GID/mem vs no-op go-fuse pread + UDP RTT", Unit: "p50 us", Krfs: latP50(r, 0),
			BaseName: fmt.Sprintf("no-op go-fuse pread (%.1f) + UDP ping-pong (%.1f)", latP50(n, 0), nb.Baseline), Baseline: latP50(n, 0) + nb.Baseline,
			Limit: "the FUSE floor plus one round trip", Source: "krfs bench read_lat --path, fuse_noop_lat"}, nil)
	} else {
		s.missing("fuse_noop_lat8")
	}
	for _, k := range []struct{ name, what, limit string }{
		{"api_read_lat8", "Go API VQP READ (bench process -> krfs mount daemon)", udpLimit},
		{"fuse_read_lat8", "FUSE pread on peers/GID/mem (direct_io)", "see the row above"},
		{"api_atomic_lat", "Go API FETCH_ADD", udpLimit},
		{"fuse_atomic_lat", "FUSE ioctl FETCH_ADD", "go-fuse ioctl ~10-18 us + UDP RTT (docs/machine-notes.md)"},
		{"api_write_lat8", "Go API WRITE 8 B", udpLimit},
		{"fuse_write_lat8", "FUSE pwrite 8 B", "go-fuse pwrite ~10 us + UDP RTT (docs/machine-notes.md)"},
	} {
		r := s.krfs(k.name)
		if r == nil {
			s.missing(k.name)
			continue
		}
		b, _ := firstBase(r)
		s.add(resultRow{Section: "8-byte READ", What: k.what, Unit: "p50 us", Krfs: latP50(r, 0), BaseName: "raw-syscall UDP ping-pong", Baseline: b.Baseline,
			Limit: k.limit, Source: "krfs bench " + r.Test + " (" + r.Mode + ")"}, nil)
	}
	for _, k := range []struct{ name, what, limit string }{
		{"api_send_lat", "Go API SEND of 64 B to a port, until delivered", udpLimit},
		{"fuse_send_lat", "FUSE write() of 64 B to peers/GID/ports/P", "go-fuse write ~10 us + UDP RTT (docs/machine-notes.md)"},
	} {
		r := s.krfs(k.name)
		if r == nil {
			s.missing(k.name)
			continue
		}
		b, _ := firstBase(r)
		s.add(resultRow{Section: "64-byte SEND", What: k.what, Unit: "p50 us", Krfs: latP50(r, 0), BaseName: "raw-syscall UDP ping-pong 64 B", Baseline: b.Baseline,
			Limit: k.limit, Source: "krfs bench send_lat (" + r.Mode + ")"}, nil)
	}
	// Rate.
	if v, ok := s.metric("BenchmarkReadRate32", "kops/s"); ok {
		e, _ := s.metric("BenchmarkReadRate32", "echo-kops/s")
		s.add(resultRow{Section: "rate, 32 outstanding", What: "softnic verbs 8 B READs (in-process)", Unit: "kops/s", Krfs: v, BaseName: "sendmmsg/recvmmsg echo x32", Baseline: e,
			Source: "verbs/softnic BenchmarkReadRate32"}, &target{">=", 0.8})
	}
	for _, k := range []struct{ name, what string }{
		{"api_rate32", "Go API 8 B READs, 32 posted (Post/Poll)"},
		{"fuse_rate32", "FUSE 8 B preads, 32 threads"},
	} {
		r := s.krfs(k.name)
		if r == nil || len(r.Bandwidth) == 0 {
			s.missing(k.name)
			continue
		}
		b, _ := firstBase(r)
		s.add(resultRow{Section: "rate, 32 outstanding", What: k.what, Unit: "kops/s", Krfs: r.Bandwidth[0].MsgRateMpps * 1e3, BaseName: "sendmmsg/recvmmsg echo x32", Baseline: b.Baseline,
			Source: "krfs bench read_bw -s 8 -t 32 (" + r.Mode + ")"}, nil)
	}
	// Hybrid: one hot peer on DC vs on its RC QP.
	if dc, rc := s.krfs("api_hybrid_dc"), s.krfs("api_hybrid_rc"); dc != nil && rc != nil && len(dc.Bandwidth) > 0 && len(rc.Bandwidth) > 0 {
		s.add(resultRow{Section: "hybrid DCT/RC", What: "one hot peer, 8 B READs x32: after its switch to RC vs pinned to DC", Unit: "kops/s",
			Krfs: rc.Bandwidth[0].MsgRateMpps * 1e3, BaseName: "same peer on a DCI (RC disabled)", Baseline: dc.Bandwidth[0].MsgRateMpps * 1e3,
			Limit: "higher is better", Source: "krfs bench read_bw --transport rc|dc"}, nil)
	} else {
		s.missing("api_hybrid_dc/rc")
	}
	// Bandwidth.
	if v, ok := s.metric("BenchmarkReadBandwidth1M", "GB/s"); ok {
		t, _ := s.metric("BenchmarkReadBandwidth1M", "tcp-GB/s")
		s.add(resultRow{Section: "1 MiB READ bandwidth", What: "softnic verbs READ (in-process)", Unit: "MiB/s", Krfs: v * 1e9 / (1 << 20), BaseName: "loopback TCP, same sizes", Baseline: t * 1e9 / (1 << 20),
			Limit: "memcpy 27-43 GB/s (docs/machine-notes.md)", Source: "verbs/softnic BenchmarkReadBandwidth1M"}, &target{">=", 0.7})
	}
	for _, k := range []struct{ name, what string }{
		{"api_bw1m", "Go API 1 MiB READs"},
		{"fuse_bw1m", "FUSE 1 MiB preads"},
	} {
		r := s.krfs(k.name)
		if r == nil || len(r.Bandwidth) == 0 {
			s.missing(k.name)
			continue
		}
		b, _ := firstBase(r)
		var t *target
		if k.name == "api_bw1m" {
			t = &target{">=", 1.0} // issue 10: no regression on loopback
		}
		s.add(resultRow{Section: "1 MiB READ bandwidth", What: fmt.Sprintf("%s, %d outstanding", k.what, r.Outstanding), Unit: "MiB/s", Krfs: r.Bandwidth[0].AvgMiBs, BaseName: b.Name, Baseline: b.Baseline,
			Limit: "memcpy 27-43 GB/s (docs/machine-notes.md)", Source: "krfs bench read_bw -s 1M (" + r.Mode + ")"}, t)
	}
	s.vethRows()
	// Memory.
	if h, ok := s.metric("BenchmarkQPCoreMemory", "rss-MiB-10000peers"); ok {
		rc, _ := s.metric("BenchmarkQPCoreMemory", "rc-mesh-B/peer")
		heap, _ := s.metric("BenchmarkQPCoreMemory", "heap-MiB-10000peers")
		slope, _ := s.metric("BenchmarkQPCoreMemory", "heap-B/peer")
		s.add(resultRow{Section: "memory", What: "node RSS growth, 10,000 peers known, 1,000 VQPs open", Unit: "MiB", Krfs: h,
			BaseName: "RC mesh to 10,000 peers (measured B/peer x 10,000)", Baseline: rc * 10000 / (1 << 20), Target: "<= 64 MiB, flat",
			Verdict: verdict(h <= 64 && slope < 1024), Source: "qpcore BenchmarkQPCoreMemory"}, nil)
		s.add(resultRow{Section: "memory", What: "node heap, 10,000 peers", Unit: "MiB", Krfs: heap, Source: "qpcore BenchmarkQPCoreMemory"}, nil)
		s.add(resultRow{Section: "memory", What: "heap growth per extra peer (5,000 -> 10,000)", Unit: "B/peer", Krfs: slope,
			BaseName: "RC connection (both QPs)", Baseline: rc, Limit: "flat = about 0", Source: "qpcore BenchmarkQPCoreMemory"}, nil)
	}
	// Full mesh.
	if dc, ok := s.metric("BenchmarkQPCoreFullMesh240", "dc-connect-ms"); ok {
		dcr, _ := s.metric("BenchmarkQPCoreFullMesh240", "dc-connect+read-ms")
		rc, _ := s.metric("BenchmarkQPCoreFullMesh240", "rc-connect-ms")
		s.add(resultRow{Section: "full mesh, 240 nodes", What: "all 57,360 VQP connects (DCT)", Unit: "ms", Krfs: dc, BaseName: "RC mesh (QP + handshake per pair)", Baseline: rc,
			Source: "qpcore BenchmarkQPCoreFullMesh240"}, nil)
		s.add(resultRow{Section: "full mesh, 240 nodes", What: "connects + first READ each (reads each peer's directory)", Unit: "ms", Krfs: dcr, BaseName: "RC mesh (no READ)", Baseline: rc,
			Source: "qpcore BenchmarkQPCoreFullMesh240"}, nil)
	}
	for _, n := range []int{16, 32, 64, 128} {
		name := fmt.Sprintf("BenchmarkQPCoreFullMeshSweep/N=%d", n)
		m, ok := s.res.GoBench[name]
		if !ok {
			continue
		}
		s.add(resultRow{Section: "full mesh sweep", What: fmt.Sprintf("%d nodes: all VQP connects (DCT)", n), Unit: "ms", Krfs: m["dc-connect-ms"],
			BaseName: "RC mesh (QP + handshake per pair)", Baseline: m["rc-connect-ms"], Source: "qpcore " + name}, nil)
	}
	// Elastic start: a fresh node reading from 100 peers.
	if k, ok := s.metric("BenchmarkQPCoreElasticStart", "krfs-ms"); ok {
		rc, _ := s.metric("BenchmarkQPCoreElasticStart", "rc-ms")
		s.add(resultRow{Section: "elastic start", What: "fresh node: open + 8-byte READ from 100 peers (VQPs over DCT)", Unit: "ms", Krfs: k,
			BaseName: "fresh NIC: RC QP + handshake + READ per peer", Baseline: rc, Source: "qpcore BenchmarkQPCoreElasticStart"}, nil)
	}
}

// vethRows are the rows across the veth of a 2-host namespace cluster
// (scripts/bench.sh's veth_rows), each beside a baseline measured on the
// same veth in the same run, with issue 10's targets; then the requesting
// daemon's memory after fio and the IP fragments each namespace created.
func (s *suite) vethRows() {
	const sec = "across veth (2-host namespace cluster)"
	rate := func(r *bench.Report) float64 {
		if r == nil || len(r.Bandwidth) == 0 {
			return 0
		}
		return r.Bandwidth[0].MsgRateMpps * 1e3
	}
	mibs := func(r *bench.Report) float64 {
		if r == nil || len(r.Bandwidth) == 0 {
			return 0
		}
		return r.Bandwidth[0].AvgMiBs
	}
	lat := func(r *bench.Report) float64 { return latP50(r, 0) }
	for _, k := range []struct {
		krfs, base, what, baseName, unit string
		get                              func(*bench.Report) float64
		t                                target
	}{
		{"veth_api_read_lat8", "veth_base_udp8", "Go API 8 B READ, host 1 -> host 2", "raw UDP ping-pong 8 B, same veth", "p50 us", lat, target{"<=", 1.3}},
		{"veth_fuse_read_lat8", "veth_base_floor_lat8", "FUSE 8 B pread on host 1's mount of host 2's mem", "FUSE floor (go-fuse, own process, one UDP RTT per read), same veth", "p50 us", lat, target{"<=", 1.2}},
		{"veth_fuse_rate32", "veth_base_floor_rate32", "FUSE 8 B preads, 32 threads", "FUSE floor, 32 threads, same veth", "kops/s", rate, target{">=", 0.8}},
		{"veth_api_bw1m", "veth_base_tcp1m", "Go API 1 MiB READs, 4 outstanding", "TCP request/response 1 MiB, depth 4, same veth", "MiB/s", mibs, target{">=", 0.9}},
		{"veth_fuse_bw1m", "veth_base_tcp1m", "FUSE 1 MiB preads, 4 outstanding", "TCP request/response 1 MiB, depth 4, same veth", "MiB/s", mibs, target{">=", 0.6}},
	} {
		r, b := s.krfs(k.krfs), s.krfs(k.base)
		if r == nil || b == nil || k.get(r) == 0 || k.get(b) == 0 {
			s.missing(k.krfs + " / " + k.base)
			continue
		}
		s.add(resultRow{Section: sec, What: k.what, Unit: k.unit, Krfs: k.get(r), BaseName: k.baseName, Baseline: k.get(b),
			Source: "krfs bench " + r.Test + " vs krfs-baseline (scripts/bench.sh veth_rows)"}, &k.t)
	}
	if v, ok := s.res.Extra["fio_rssanon_kib"]; ok {
		mib := v / 1024
		what := "requesting daemon's RssAnon after fio (randrw, 4 jobs, bsrange 512-1M) on a peer file"
		if rc := s.res.Extra["fio_rc"]; rc != 0 {
			what += fmt.Sprintf(" (fio exited with %.0f: I/O errors, see raw/veth_fio.log)", rc)
		}
		s.add(resultRow{Section: sec, What: what, Unit: "MiB", Krfs: mib,
			Limit: "exported memory is shared, not counted", Target: "<= 64 MiB", Verdict: verdict(mib <= 64), Source: "/proc/PID/status of host 1's krfs mount"}, nil)
	} else {
		s.missing("fio RssAnon")
	}
	for _, ns := range []string{"h1", "h2", "meta"} {
		b, ok1 := s.res.Extra["frag_before_"+ns]
		a, ok2 := s.res.Extra["frag_after_"+ns]
		if !ok1 || !ok2 {
			continue
		}
		s.add(resultRow{Section: sec, What: fmt.Sprintf("Ip FragCreates in namespace %s during the veth rows (before %.0f, after %.0f)", ns, b, a), Unit: "fragments",
			Krfs: a - b, Target: "0", Verdict: verdict(a == b), Source: "/proc/net/snmp"}, nil)
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func fmtNum(v float64) string {
	switch {
	case v == 0:
		return "—"
	case math.Abs(v) >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func (s *suite) markdown() string {
	var b strings.Builder
	m := s.res.Machine
	fmt.Fprintf(&b, "# krfs benchmark results\n\n%s, %s CPUs (%s), kernel %s, %s. All figures from one run of scripts/bench.sh; ratio = krfs / baseline.\n\n",
		s.res.Date, m["cpus"], m["cpu"], m["kernel"], m["go"])
	section := ""
	for _, r := range s.res.Rows {
		if r.Section != section {
			section = r.Section
			fmt.Fprintf(&b, "\n## %s\n\n| measurement | unit | krfs | baseline | baseline value | ratio | limit | target | verdict |\n|---|---|---:|---|---:|---:|---|---|---|\n", section)
		}
		ratio := "—"
		if r.Ratio != 0 && !math.IsNaN(r.Ratio) && !math.IsInf(r.Ratio, 0) {
			ratio = fmt.Sprintf("%.3gx", r.Ratio)
		}
		v := r.Verdict
		if v == "MISSED" {
			v = "**MISSED**"
		}
		k := fmtNum(r.Krfs)
		if r.Unit == "fragments" {
			k = strconv.FormatFloat(r.Krfs, 'f', 0, 64) // 0 is the figure, not a gap
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.What, r.Unit, k, r.BaseName, fmtNum(r.Baseline), ratio, r.Limit, r.Target, v)
	}
	if sw := s.krfs("api_sweep"); sw != nil {
		b.WriteString("\n## READ latency vs size (p50 us)\n\n| bytes | Go API | FUSE pread | no-op go-fuse pread | UDP ping-pong |\n|---:|---:|---:|---:|---:|\n")
		at := func(name string, i int) float64 {
			r := s.krfs(name)
			if r != nil && len(r.Tables) > 0 && i < len(r.Tables[0].Rows) {
				return r.Tables[0].Rows[i].TypicalUs
			}
			return 0
		}
		for i, row := range sw.Tables[0].Rows {
			f, nf, u := at("fuse_sweep", i), at("fuse_noop_sweep", i), 0.0
			for _, bl := range sw.Baselines {
				if bl.Bytes == row.Bytes {
					u = bl.Baseline
				}
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", row.Bytes, fmtNum(row.TypicalUs), fmtNum(f), fmtNum(nf), fmtNum(u))
		}
	}
	if len(s.res.Plots) > 0 {
		b.WriteString("\n## Plots\n\n")
		for _, p := range s.res.Plots {
			fmt.Fprintf(&b, "- [%s](%s)\n", p, p)
		}
	}
	if len(s.res.Missing) > 0 {
		fmt.Fprintf(&b, "\nNot measured in this run: %s.\n", strings.Join(s.res.Missing, ", "))
	}
	return b.String()
}

func (s *suite) plots(dir string) error {
	write := func(name string, c plot.Chart) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = c.WriteSVG(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(filepath.Join(dir, name))
			return fmt.Errorf("%s: %w", name, err)
		}
		s.res.Plots = append(s.res.Plots, name)
		return nil
	}
	// Latency vs size.
	lat := plot.Chart{Title: "READ latency vs size (p50)", XLabel: "bytes", YLabel: "usec", LogX: true, LogY: true, Pow2X: true}
	base := plot.Series{Name: "raw UDP ping-pong"}
	for _, k := range []struct{ name, label string }{{"api_sweep", "krfs Go API"}, {"fuse_sweep", "krfs FUSE pread"}, {"fuse_noop_sweep", "no-op go-fuse pread"}} {
		r := s.krfs(k.name)
		if r == nil || len(r.Tables) == 0 {
			continue
		}
		sr := plot.Series{Name: k.label}
		for _, row := range r.Tables[0].Rows {
			sr.X, sr.Y = append(sr.X, float64(row.Bytes)), append(sr.Y, row.TypicalUs)
		}
		lat.Series = append(lat.Series, sr)
		if len(base.X) == 0 {
			for _, bl := range r.Baselines {
				base.X, base.Y = append(base.X, float64(bl.Bytes)), append(base.Y, bl.Baseline)
			}
		}
	}
	if len(base.X) > 0 {
		lat.Series = append(lat.Series, base)
	}
	if len(lat.Series) > 0 {
		if err := write("latency_vs_size.svg", lat); err != nil {
			return err
		}
	}
	// Memory vs peers.
	if m := s.bench("BenchmarkQPCoreMemory"); m != nil {
		c := plot.Chart{Title: "node heap vs peers known (1,000 VQPs open)", XLabel: "peers", YLabel: "MiB", LogY: true}
		k, rc := plot.Series{Name: "krfs (DCT pool)"}, plot.Series{Name: "RC mesh (measured per-peer cost)"}
		var pts []int
		for unit := range m {
			var n int
			if _, err := fmt.Sscanf(unit, "heap-MiB-%dpeers", &n); err == nil {
				pts = append(pts, n)
			}
		}
		sort.Ints(pts)
		for _, n := range pts {
			k.X, k.Y = append(k.X, float64(n)), append(k.Y, m[fmt.Sprintf("heap-MiB-%dpeers", n)])
			rc.X, rc.Y = append(rc.X, float64(n)), append(rc.Y, m["rc-mesh-B/peer"]*float64(n)/(1<<20))
		}
		if len(k.X) > 0 && m["rc-mesh-B/peer"] > 0 {
			c.Series = []plot.Series{k, rc}
			if err := write("memory_vs_peers.svg", c); err != nil {
				return err
			}
		}
	}
	// Mesh time vs N.
	c := plot.Chart{Title: "full mesh build time vs nodes", XLabel: "nodes", YLabel: "ms", LogY: true}
	for _, k := range []struct{ unit, name string }{{"dc-connect-ms", "DCT VQP connects"}, {"dc-connect+read-ms", "DCT connects + first READ"}, {"rc-connect-ms", "RC mesh"}} {
		sr := plot.Series{Name: k.name}
		var ns []int
		for name, m := range s.res.GoBench {
			var n int
			_, err := fmt.Sscanf(name, "BenchmarkQPCoreFullMeshSweep/N=%d", &n)
			if err != nil {
				_, err = fmt.Sscanf(name, "BenchmarkQPCoreFullMesh%d", &n)
			}
			if err == nil && m[k.unit] > 0 {
				ns = append(ns, n)
			}
		}
		sort.Ints(ns)
		for _, n := range ns {
			m := s.res.GoBench[fmt.Sprintf("BenchmarkQPCoreFullMeshSweep/N=%d", n)]
			if m == nil {
				m = s.res.GoBench[fmt.Sprintf("BenchmarkQPCoreFullMesh%d", n)]
			}
			sr.X, sr.Y = append(sr.X, float64(n)), append(sr.Y, m[k.unit])
		}
		if len(sr.X) > 0 {
			c.Series = append(c.Series, sr)
		}
	}
	if len(c.Series) > 0 {
		if err := write("mesh_vs_nodes.svg", c); err != nil {
			return err
		}
	}
	return nil
}
