package report

import (
	"fmt"
	"slices"

	"github.com/krfs/krfs/bench"
)

// The comparison tables are data: rowTable lists every row in the order
// it is printed, each as a rowSpec — where its krfs figure and its
// baseline come from, and how the two are judged. rows walks the table;
// nothing else decides what a row shows.

// measure reads one figure of the run: its value and whether the run has
// it. With record, an absent figure is added to the "not measured" list
// (a figure that is absent without being a gap, like a sweep size that
// was not run, records nothing either way).
type measure func(s *suite, record bool) (float64, bool)

// goal is a row's target when it is not a ratio: its text, and whether a
// row's figures meet it.
type goal struct {
	text string
	met  func(s *suite, krfs, base float64) bool
}

// rowSpec is one row of the comparison tables.
type rowSpec struct {
	section, what, unit string
	// gate: the row is shown only if every one of these figures exists,
	// read in order (the first absent one is recorded, the rest not read).
	gate []measure
	// group: figures of the row's group read (and recorded if absent), in
	// this order, once the gate passed, so that the "not measured" list
	// names them in the group's order.
	group []measure
	// krfs is the krfs figure; base the baseline measured in the same
	// run (nil: none), named baseName. Either may be absent once the gate
	// passed: the row then shows 0 (—) for it.
	krfs     measure
	baseName string
	base     measure
	// limit and source are printed as they are.
	limit, source string
	// The ratio is krfs / base; ratio states the target for it
	// (nil: none). goal replaces it for rows judged otherwise.
	ratio *target
	goal  *goal
	// Texts that depend on the run (report fields, figures) override the
	// static ones.
	whatFn, baseNameFn, sourceFn func(s *suite) string
}

// rows builds the comparison tables from rowTable.
func (s *suite) rows() {
	for _, spec := range rowTable() {
		s.addSpec(spec)
	}
}

// addSpec adds spec's row if its gate passes.
func (s *suite) addSpec(spec rowSpec) {
	for _, g := range spec.gate {
		if _, ok := g(s, true); !ok {
			return
		}
	}
	for _, m := range spec.group {
		m(s, true)
	}
	r := resultRow{Section: spec.section, What: spec.what, Unit: spec.unit, BaseName: spec.baseName, Limit: spec.limit, Source: spec.source}
	for _, o := range []struct {
		dst *string
		fn  func(*suite) string
	}{{&r.What, spec.whatFn}, {&r.BaseName, spec.baseNameFn}, {&r.Source, spec.sourceFn}} {
		if o.fn != nil {
			*o.dst = o.fn(s)
		}
	}
	r.Krfs, _ = spec.krfs(s, true)
	if spec.base != nil {
		r.Baseline, _ = spec.base(s, true)
	}
	if spec.goal != nil {
		r.Target = spec.goal.text
		r.Verdict = verdict(spec.goal.met(s, r.Krfs, r.Baseline))
	}
	s.add(r, spec.ratio)
}

// goMetric is unit of `go test -bench` benchmark b; recorded as "b (not
// run)" or "b unit" when absent.
func goMetric(b, unit string) measure {
	return func(s *suite, record bool) (float64, bool) {
		if record {
			return s.metric(b, unit)
		}
		v, ok := s.res.GoBench[b][unit]
		return v, ok
	}
}

// goOptional is goMetric that is never recorded as absent.
func goOptional(b, unit string) measure {
	return func(s *suite, _ bool) (float64, bool) {
		v, ok := s.res.GoBench[b][unit]
		return v, ok
	}
}

// goRun is whether benchmark b ran at all (never recorded).
func goRun(b string) measure {
	return func(s *suite, _ bool) (float64, bool) {
		_, ok := s.res.GoBench[b]
		return 0, ok
	}
}

// scaled is m * mul / div (a unit conversion).
func scaled(m measure, mul, div float64) measure {
	return func(s *suite, record bool) (float64, bool) {
		v, ok := m(s, record)
		return v * mul / div, ok
	}
}

// reports is whether the krfs bench reports names all exist and satisfy
// cond (nil: any); recorded as label when not ("": never recorded).
func reports(label string, cond func(*bench.Report) bool, names ...string) measure {
	return func(s *suite, record bool) (float64, bool) {
		for _, n := range names {
			r := s.krfs(n)
			if r == nil || cond != nil && !cond(r) {
				if record && label != "" {
					s.missing(label)
				}
				return 0, false
			}
		}
		return 0, true
	}
}

// report is reports(name, cond, name): the one report exists.
func report(name string, cond func(*bench.Report) bool) measure { return reports(name, cond, name) }

func tables(n int) func(*bench.Report) bool {
	return func(r *bench.Report) bool { return len(r.Tables) >= n }
}

func hasBandwidth(r *bench.Report) bool { return len(r.Bandwidth) > 0 }

// fromReport is f of krfs bench report name (0 if it is absent).
func fromReport(name string, f func(*bench.Report) float64) measure {
	return func(s *suite, _ bool) (float64, bool) {
		r := s.krfs(name)
		if r == nil {
			return 0, false
		}
		return f(r), true
	}
}

func latOf(table int) func(*bench.Report) float64 {
	return func(r *bench.Report) float64 { return latP50(r, table) }
}

func rateOf(r *bench.Report) float64 {
	if len(r.Bandwidth) == 0 {
		return 0
	}
	return r.Bandwidth[0].MsgRateMpps * 1e3
}

func mibsOf(r *bench.Report) float64 {
	if len(r.Bandwidth) == 0 {
		return 0
	}
	return r.Bandwidth[0].AvgMiBs
}

func baseOf(r *bench.Report) float64 { b, _ := firstBase(r); return b.Baseline }

// lat is the p50 of table in report name; base its first baseline.
func lat(name string, table int) measure { return fromReport(name, latOf(table)) }
func base(name string) measure           { return fromReport(name, baseOf) }

// extra is a "key value" figure of raw/*.kv; recorded as label when
// absent ("": never).
func extra(key, label string) measure {
	return func(s *suite, record bool) (float64, bool) {
		v, ok := s.res.Extra[key]
		if !ok && record && label != "" {
			s.missing(label)
		}
		return v, ok
	}
}

// reportSource is "krfs bench TEST (MODE)"-like text from report name.
func reportSource(name string, f func(r *bench.Report) string) func(*suite) string {
	return func(s *suite) string { return f(s.krfs(name)) }
}

// rowTable is every row of the comparison tables, in print order.
func rowTable() []rowSpec {
	const udpLimit = "UDP ping-pong is the floor"
	const machineLimit = " (docs/machine-notes.md)"
	var t []rowSpec
	add := func(r ...rowSpec) { t = append(t, r...) }

	// Connect.
	const connect = "BenchmarkQPCoreConnect"
	warm, rc, cold, read := goMetric(connect, "warm-p50-us"), goMetric(connect, "rc-p50-us"), goMetric(connect, "cold-p50-us"), goMetric(connect, "read-p50-us")
	connectGroup := []measure{rc, cold, read}
	add(
		rowSpec{section: "connect", what: "VQP connect, warm (known peer) vs RC from scratch", unit: "p50 us", gate: []measure{warm}, group: connectGroup,
			krfs: warm, baseName: "RC QP create + handshake", base: rc, source: "qpcore BenchmarkQPCoreConnect (in-process)",
			goal: &goal{"warm p50 <= 2 us; RC/warm >= 20x (ratio <= 0.05)", func(_ *suite, w, rc float64) bool { return w <= 2 && rc/w >= 20 }}},
		rowSpec{section: "connect", what: "VQP connect, cold (one meta READ) vs one READ", unit: "p50 us", gate: []measure{warm}, krfs: cold,
			baseName: "one 64 B READ of the meta table", base: read, limit: "one READ round trip", source: "qpcore BenchmarkQPCoreConnect", ratio: &target{"<=", 1.3}},
		rowSpec{section: "connect", what: "VQP connect, cold vs RC from scratch", unit: "p50 us", gate: []measure{warm}, krfs: cold,
			baseName: "RC QP create + handshake", base: rc, source: "qpcore BenchmarkQPCoreConnect"},
		rowSpec{section: "connect", what: "VQP connect, cold vs TCP connect + 1 round trip", unit: "p50 us", gate: []measure{warm, goMetric("BenchmarkTCPConnectRoundTrip", "p50-us")},
			krfs: cold, baseName: "TCP dial+accept+1 RTT", base: goMetric("BenchmarkTCPConnectRoundTrip", "p50-us"), source: "qpcore + bench/baseline benchmarks"},
		rowSpec{section: "connect", what: "krfs bench connect (API, separate process, real meta): cold", unit: "p50 us", gate: []measure{report("api_connect", tables(2))},
			krfs: lat("api_connect", 1), baseName: "TCP dial+accept+1 RTT", base: base("api_connect"), source: "krfs bench connect --baseline"},
		rowSpec{section: "connect", what: "krfs bench connect (API): cold connect + first 8 B READ", unit: "p50 us", gate: []measure{reports("", tables(3), "api_connect")},
			krfs: lat("api_connect", 2), baseName: "TCP dial+accept+1 RTT", base: base("api_connect"), source: "krfs bench connect --baseline"},
		rowSpec{section: "connect", what: "FUSE open+close of peers/GID/mem (a VQP each)", unit: "p50 us", gate: []measure{reports("", tables(1), "fuse_connect")},
			krfs: lat("fuse_connect", 0), baseName: "TCP dial+accept+1 RTT", base: base("fuse_connect"), limit: "go-fuse open+close ~17-51 us" + machineLimit, source: "krfs bench connect --path"},
	)

	// Meta lookups.
	for _, c := range []int{1, 8} {
		name := fmt.Sprintf("BenchmarkMetaOneSidedVsRPC/udp/clients=%d", c)
		one := goMetric(name, "onesided-ops/s")
		r := rowSpec{section: "meta lookup", what: fmt.Sprintf("one-sided lookups, %d client(s), vs RPC", c), unit: "lookups/s", gate: []measure{one}, krfs: one,
			baseName: "RPC lookups", base: goMetric(name, "rpc-ops/s"), source: "meta BenchmarkMetaOneSidedVsRPC (udp)"}
		if c == 8 {
			r.ratio = &target{">=", 1.5}
		}
		add(r)
	}
	add(rowSpec{section: "meta lookup", what: "krfs bench meta_lookup (separate process): one-sided vs RPC latency", unit: "p50 us",
		gate: []measure{reports("", func(r *bench.Report) bool { return len(r.Tables) == 2 }, "api_meta_lookup")},
		krfs: lat("api_meta_lookup", 0), baseName: "RPC lookup", base: lat("api_meta_lookup", 1), limit: "lower is better", source: "krfs bench meta_lookup"})

	// 8-byte READ.
	const read8 = "8-byte READ"
	add(
		rowSpec{section: read8, what: "softnic verbs READ (in-process)", unit: "p50 us", gate: []measure{goMetric("BenchmarkReadLatency8B", "p50-us")},
			krfs: goMetric("BenchmarkReadLatency8B", "p50-us"), baseName: "raw-syscall UDP ping-pong", base: goMetric("BenchmarkReadLatency8B", "udp-p50-us"),
			limit: udpLimit, source: "verbs/softnic BenchmarkReadLatency8B", ratio: &target{"<=", 1.25}},
		rowSpec{section: read8, what: "qpcore VQP READ, 64 B (in-process)", unit: "p50 us", gate: []measure{goMetric("BenchmarkQPCoreRead", "read-p50-us")},
			krfs: goMetric("BenchmarkQPCoreRead", "read-p50-us"), baseName: "raw-syscall UDP ping-pong 64 B", base: goMetric("BenchmarkQPCoreRead", "udp-pingpong-p50-us"),
			limit: udpLimit, source: "qpcore BenchmarkQPCoreRead", ratio: &target{"<=", 1.3}},
		rowSpec{section: read8, what: "FUSE pread on peers/GID/mem vs no-op go-fuse pread + UDP RTT", unit: "p50 us",
			gate: []measure{reports("fuse_noop_lat8", nil, "fuse_read_lat8", "fuse_noop_lat8")}, krfs: lat("fuse_read_lat8", 0),
			baseNameFn: func(s *suite) string {
				n := s.krfs("fuse_noop_lat8")
				return fmt.Sprintf("no-op go-fuse pread (%.1f) + UDP ping-pong (%.1f)", latP50(n, 0), baseOf(n))
			},
			base:  fromReport("fuse_noop_lat8", func(n *bench.Report) float64 { return latP50(n, 0) + baseOf(n) }),
			limit: "the FUSE floor plus one round trip", source: "krfs bench read_lat --path, fuse_noop_lat"},
	)
	reportTestMode := func(r *bench.Report) string { return "krfs bench " + r.Test + " (" + r.Mode + ")" }
	for _, k := range []struct{ name, what, limit string }{
		{"api_read_lat8", "Go API VQP READ (bench process -> krfs mount daemon)", udpLimit},
		{"fuse_read_lat8", "FUSE pread on peers/GID/mem (direct_io)", "see the row above"},
		{"api_atomic_lat", "Go API FETCH_ADD", udpLimit},
		{"fuse_atomic_lat", "FUSE ioctl FETCH_ADD", "go-fuse ioctl ~10-18 us + UDP RTT" + machineLimit},
		{"api_write_lat8", "Go API WRITE 8 B", udpLimit},
		{"fuse_write_lat8", "FUSE pwrite 8 B", "go-fuse pwrite ~10 us + UDP RTT" + machineLimit},
	} {
		add(rowSpec{section: read8, what: k.what, unit: "p50 us", gate: []measure{report(k.name, nil)}, krfs: lat(k.name, 0),
			baseName: "raw-syscall UDP ping-pong", base: base(k.name), limit: k.limit, sourceFn: reportSource(k.name, reportTestMode)})
	}
	for _, k := range []struct{ name, what, limit string }{
		{"api_send_lat", "Go API SEND of 64 B to a port, until delivered", udpLimit},
		{"fuse_send_lat", "FUSE write() of 64 B to peers/GID/ports/P", "go-fuse write ~10 us + UDP RTT" + machineLimit},
	} {
		add(rowSpec{section: "64-byte SEND", what: k.what, unit: "p50 us", gate: []measure{report(k.name, nil)}, krfs: lat(k.name, 0),
			baseName: "raw-syscall UDP ping-pong 64 B", base: base(k.name), limit: k.limit,
			sourceFn: reportSource(k.name, func(r *bench.Report) string { return "krfs bench send_lat (" + r.Mode + ")" })})
	}

	// Rate.
	const rate32 = "rate, 32 outstanding"
	add(rowSpec{section: rate32, what: "softnic verbs 8 B READs (in-process)", unit: "kops/s", gate: []measure{goMetric("BenchmarkReadRate32", "kops/s")},
		krfs: goMetric("BenchmarkReadRate32", "kops/s"), baseName: "sendmmsg/recvmmsg echo x32", base: goMetric("BenchmarkReadRate32", "echo-kops/s"),
		source: "verbs/softnic BenchmarkReadRate32", ratio: &target{">=", 0.8}})
	for _, k := range []struct{ name, what string }{
		{"api_rate32", "Go API 8 B READs, 32 posted (Post/Poll)"},
		{"fuse_rate32", "FUSE 8 B preads, 32 threads"},
	} {
		add(rowSpec{section: rate32, what: k.what, unit: "kops/s", gate: []measure{report(k.name, hasBandwidth)}, krfs: fromReport(k.name, rateOf),
			baseName: "sendmmsg/recvmmsg echo x32", base: base(k.name),
			sourceFn: reportSource(k.name, func(r *bench.Report) string { return "krfs bench read_bw -s 8 -t 32 (" + r.Mode + ")" })})
	}
	// Hybrid: one hot peer on DC vs on its RC QP.
	add(rowSpec{section: "hybrid DCT/RC", what: "one hot peer, 8 B READs x32: after its switch to RC vs pinned to DC", unit: "kops/s",
		gate: []measure{reports("api_hybrid_dc/rc", hasBandwidth, "api_hybrid_dc", "api_hybrid_rc")}, krfs: fromReport("api_hybrid_rc", rateOf),
		baseName: "same peer on a DCI (RC disabled)", base: fromReport("api_hybrid_dc", rateOf), limit: "higher is better", source: "krfs bench read_bw --transport rc|dc"})

	// Bandwidth.
	const bw = "1 MiB READ bandwidth"
	const memcpy = "memcpy 27-43 GB/s" + machineLimit
	add(rowSpec{section: bw, what: "softnic verbs READ (in-process)", unit: "MiB/s", gate: []measure{goMetric("BenchmarkReadBandwidth1M", "GB/s")},
		krfs: scaled(goMetric("BenchmarkReadBandwidth1M", "GB/s"), 1e9, 1<<20), baseName: "loopback TCP, same sizes",
		base: scaled(goMetric("BenchmarkReadBandwidth1M", "tcp-GB/s"), 1e9, 1<<20), limit: memcpy, source: "verbs/softnic BenchmarkReadBandwidth1M", ratio: &target{">=", 0.7}})
	for _, k := range []struct {
		name, what string
		ratio      *target
	}{
		{"api_bw1m", "Go API 1 MiB READs", &target{">=", 1.0}}, // issue 10: no regression on loopback
		{"fuse_bw1m", "FUSE 1 MiB preads", nil},
	} {
		add(rowSpec{section: bw, unit: "MiB/s", gate: []measure{report(k.name, hasBandwidth)}, krfs: fromReport(k.name, mibsOf), base: base(k.name),
			whatFn:     reportSource(k.name, func(r *bench.Report) string { return fmt.Sprintf("%s, %d outstanding", k.what, r.Outstanding) }),
			baseNameFn: reportSource(k.name, func(r *bench.Report) string { b, _ := firstBase(r); return b.Name }),
			limit:      memcpy, sourceFn: reportSource(k.name, func(r *bench.Report) string { return "krfs bench read_bw -s 1M (" + r.Mode + ")" }), ratio: k.ratio})
	}

	// Across the veth of a 2-host namespace cluster (scripts/bench.sh's
	// veth_rows), each beside a baseline measured on the same veth in the
	// same run, with issue 10's targets; then the requesting daemon's
	// memory after fio and the IP fragments each namespace created. The
	// latency rows carry their baseline in the krfs report (base ""):
	// krfs bench measured it in chunks between its own (--baseline-echo,
	// --baseline-floor); the others have it in a krfs-baseline report.
	const veth = "across veth (2-host namespace cluster)"
	for _, k := range []struct {
		krfs, base, what, baseName, unit string
		get                              func(*bench.Report) float64
		t                                target
	}{
		{"veth_api_read_lat8", "", "Go API 8 B READ, host 1 -> host 2", "raw UDP ping-pong 8 B, same veth, alternating chunks", "p50 us", latOf(0), target{"<=", 1.3}},
		{"veth_api_connect", "", "Go API cold connect + first 8 B READ, host 1 -> host 2, meta service on its own host", "raw UDP: one round trip to the meta host, then one to host 2, after each", "p50 us", latOf(2), target{"<=", 1.3}},
		{"veth_fuse_read_lat8", "", "FUSE 8 B pread on host 1's mount of host 2's mem", "FUSE floor (go-fuse, own process, one UDP RTT per read), same veth, alternating chunks", "p50 us", latOf(0), target{"<=", 1.2}},
		{"veth_fuse_rate32", "veth_base_floor_rate32", "FUSE 8 B preads, 32 threads", "FUSE floor, 32 threads, same veth", "kops/s", rateOf, target{">=", 0.8}},
		{"veth_api_bw1m", "veth_base_tcp1m", "Go API 1 MiB READs, 4 outstanding", "TCP request/response 1 MiB, depth 4, same veth", "MiB/s", mibsOf, target{">=", 0.9}},
		{"veth_fuse_bw1m", "veth_base_tcp1m_fuse", "FUSE 1 MiB preads, 4 outstanding", "TCP request/response 1 MiB, depth 4, same veth", "MiB/s", mibsOf, target{">=", 0.9}},
		{"veth_fuse_read_lat8_udp", "", "FUSE 8 B pread, --fuse-transport auto (io_uring when the kernel offers it)", "raw UDP ping-pong 8 B, same veth, alternating chunks", "p50 us", latOf(0), target{"<=", 1.8}},
		{"veth_dev_fuse_read_lat8_udp", "", "FUSE 8 B pread, --fuse-transport dev", "raw UDP ping-pong 8 B, same veth, alternating chunks", "p50 us", latOf(0), target{"<=", 1.8}},
		{"veth_fuse_rate32_b", "veth_dev_fuse_rate32", "FUSE 8 B preads, 32 threads, --fuse-transport auto", "the same on a --fuse-transport dev mount, run just before", "kops/s", rateOf, target{">=", 2}},
		{"veth_dev_fuse_bw1m", "veth_base_tcp1m_fuse", "FUSE 1 MiB preads, 4 outstanding, --fuse-transport dev", "TCP request/response 1 MiB, depth 4, same veth", "MiB/s", mibsOf, target{">=", 0.9}},
		{"veth_api_wbw1m", "veth_base_tcp1m_w", "Go API 1 MiB WRITEs, 4 outstanding", "TCP request/response 1 MiB, depth 4, same veth", "MiB/s", mibsOf, target{}},
		{"veth_fuse_wbw1m", "veth_base_tcp1m_w", "FUSE 1 MiB pwrites, 4 outstanding", "TCP request/response 1 MiB, depth 4, same veth", "MiB/s", mibsOf, target{}},
	} {
		spec := rowSpec{section: veth, what: k.what, unit: k.unit, krfs: fromReport(k.krfs, k.get), baseName: k.baseName, ratio: &k.t}
		if k.t == (target{}) { // no target: the row compares builds (the WRITE rows)
			spec.ratio = nil
		}
		if k.base == "" {
			spec.gate = []measure{report(k.krfs, func(r *bench.Report) bool { _, ok := firstBase(r); return ok && k.get(r) != 0 })}
			spec.base = base(k.krfs)
			spec.sourceFn = reportSource(k.krfs, func(r *bench.Report) string {
				return "krfs bench " + r.Test + ", baseline in the same process (scripts/bench.sh veth_rows)"
			})
		} else {
			spec.gate = []measure{reports(k.krfs+" / "+k.base, func(r *bench.Report) bool { return k.get(r) != 0 }, k.krfs, k.base)}
			spec.base = fromReport(k.base, k.get)
			spec.sourceFn = reportSource(k.krfs, func(r *bench.Report) string {
				return "krfs bench " + r.Test + " vs krfs-baseline (scripts/bench.sh veth_rows)"
			})
		}
		add(spec)
	}
	add(rowSpec{section: veth, unit: "MiB", gate: []measure{extra("fio_rssanon_kib", "fio RssAnon")},
		whatFn: func(s *suite) string {
			what := "requesting daemon's RssAnon after fio (randrw, 4 jobs, bsrange 512-1M) on a peer file"
			if rc := s.res.Extra["fio_rc"]; rc != 0 {
				what += fmt.Sprintf(" (fio exited with %.0f: I/O errors, see raw/veth_fio.log)", rc)
			}
			return what
		},
		krfs: scaled(extra("fio_rssanon_kib", ""), 1, 1024), limit: "exported memory is shared, not counted", source: "/proc/PID/status of host 1's krfs mount",
		goal: &goal{"<= 64 MiB", func(_ *suite, mib, _ float64) bool { return mib <= 64 }}})
	for _, ns := range []string{"h1", "h2", "meta"} {
		before, after := extra("frag_before_"+ns, ""), extra("frag_after_"+ns, "")
		add(rowSpec{section: veth, unit: "fragments", gate: []measure{before, after},
			whatFn: func(s *suite) string {
				b, _ := before(s, false)
				a, _ := after(s, false)
				return fmt.Sprintf("Ip FragCreates in namespace %s during the veth rows (before %.0f, after %.0f)", ns, b, a)
			},
			krfs: func(s *suite, _ bool) (float64, bool) {
				b, _ := before(s, false)
				a, ok := after(s, false)
				return a - b, ok
			},
			source: "/proc/net/snmp", goal: &goal{"0", func(_ *suite, created, _ float64) bool { return created == 0 }}})
	}

	// Memory.
	const mem = "BenchmarkQPCoreMemory"
	rss, rcMesh, heap, slope := goMetric(mem, "rss-MiB-10000peers"), goMetric(mem, "rc-mesh-B/peer"), goMetric(mem, "heap-MiB-10000peers"), goMetric(mem, "heap-B/peer")
	add(
		rowSpec{section: "memory", what: "node RSS growth, 10,000 peers known, 1,000 VQPs open", unit: "MiB", gate: []measure{rss}, group: []measure{rcMesh, heap, slope},
			krfs: rss, baseName: "RC mesh to 10,000 peers (measured B/peer x 10,000)", base: scaled(rcMesh, 10000, 1<<20), source: "qpcore BenchmarkQPCoreMemory",
			goal: &goal{"<= 64 MiB, flat", func(s *suite, h, _ float64) bool { sl, _ := slope(s, false); return h <= 64 && sl < 1024 }}},
		rowSpec{section: "memory", what: "node heap, 10,000 peers", unit: "MiB", gate: []measure{rss}, krfs: heap, source: "qpcore BenchmarkQPCoreMemory"},
		rowSpec{section: "memory", what: "heap growth per extra peer (5,000 -> 10,000)", unit: "B/peer", gate: []measure{rss}, krfs: slope,
			baseName: "RC connection (both QPs)", base: rcMesh, limit: "flat = about 0", source: "qpcore BenchmarkQPCoreMemory"},
	)

	// Full mesh.
	const mesh = "BenchmarkQPCoreFullMesh240"
	dc, dcRead, rcConn := goMetric(mesh, "dc-connect-ms"), goMetric(mesh, "dc-connect+read-ms"), goMetric(mesh, "rc-connect-ms")
	add(
		rowSpec{section: "full mesh, 240 nodes", what: "all 57,360 VQP connects (DCT)", unit: "ms", gate: []measure{dc}, group: []measure{dcRead, rcConn},
			krfs: dc, baseName: "RC mesh (QP + handshake per pair)", base: rcConn, source: "qpcore BenchmarkQPCoreFullMesh240"},
		rowSpec{section: "full mesh, 240 nodes", what: "connects + first READ each (reads each peer's directory)", unit: "ms", gate: []measure{dc},
			krfs: dcRead, baseName: "RC mesh (no READ)", base: rcConn, source: "qpcore BenchmarkQPCoreFullMesh240"},
	)
	for _, n := range []int{16, 32, 64, 128} {
		name := fmt.Sprintf("BenchmarkQPCoreFullMeshSweep/N=%d", n)
		add(rowSpec{section: "full mesh sweep", what: fmt.Sprintf("%d nodes: all VQP connects (DCT)", n), unit: "ms", gate: []measure{goRun(name)},
			krfs: goOptional(name, "dc-connect-ms"), baseName: "RC mesh (QP + handshake per pair)", base: goOptional(name, "rc-connect-ms"), source: "qpcore " + name})
	}
	// Elastic start: a fresh node reading from 100 peers.
	const elastic = "BenchmarkQPCoreElasticStart"
	add(rowSpec{section: "elastic start", what: "fresh node: open + 8-byte READ from 100 peers (VQPs over DCT)", unit: "ms", gate: []measure{goMetric(elastic, "krfs-ms")},
		krfs: goMetric(elastic, "krfs-ms"), baseName: "fresh NIC: RC QP + handshake + READ per peer", base: goMetric(elastic, "rc-ms"), source: "qpcore " + elastic})
	return slices.Clip(t)
}
