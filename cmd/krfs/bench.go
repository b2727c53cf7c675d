package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/internal/baseline"
)

// krfs bench: perftest-style benchmarks, through the Go API against a node
// of a running cluster (--meta, --gid) or through the file interface of a
// mounted krfs (--path). `krfs bench report DIR` turns the outputs of
// scripts/bench.sh into results.json, results.md and plots.

var benchTests = []struct{ name, help string }{
	{"read_lat", "synchronous one-sided READ latency"},
	{"write_lat", "synchronous one-sided WRITE latency"},
	{"atomic_lat", "FETCH_ADD latency (8 bytes)"},
	{"read_bw", "READ bandwidth and message rate with -t outstanding"},
	{"write_bw", "WRITE bandwidth and message rate with -t outstanding"},
	{"send_lat", "latency of a delivered SEND to a port of the peer"},
	{"connect", "VQP connect to a known (warm) and an unknown (cold) peer; file mode: open+close"},
	{"meta_lookup", "meta lookup of the peer: one-sided READ vs RPC (API mode only)"},
	{"fullmesh", "reach every live node of the cluster: cold VQP connect + 8-byte READ to each, per iteration (API mode only)"},
	{"fuse_noop_lat", "baseline: pread of an in-memory go-fuse file the bench mounts itself (no --meta or --path; root)"},
}

type benchOpts struct {
	test        string
	sizeStr     string
	size        int64
	iters       int
	all         bool
	outstanding int
	duration    float64 // seconds; 0: -n iterations
	json        bool
	meta        string
	gid         uint
	listen      string
	register    bool
	path        string
	region      string
	port        uint
	baseline    bool
	progress    string // auto, on, off
	timeout     time.Duration
	transport   string // API mode: auto, dc, rc
}

func (o *benchOpts) isLat() bool   { return strings.HasSuffix(o.test, "_lat") }
func (o *benchOpts) isBW() bool    { return strings.HasSuffix(o.test, "_bw") }
func (o *benchOpts) apiMode() bool { return o.path == "" && o.test != "fuse_noop_lat" }

func (o *benchOpts) mode() string {
	if o.apiMode() {
		return "api"
	}
	return "file"
}

const (
	sweepMin = 8
	sweepMax = 1 << 20
)

// parseBenchArgs parses `krfs bench` arguments; the test name may come
// before or after the flags.
func parseBenchArgs(args []string, stderr io.Writer) (*benchOpts, error) {
	o := &benchOpts{}
	set := flag.NewFlagSet("krfs bench", flag.ContinueOnError)
	set.SetOutput(stderr)
	set.StringVar(&o.sizeStr, "s", "", "message size, like 8, 4K, 1M (default 8; 1M for *_bw)")
	set.IntVar(&o.iters, "n", 0, "iterations (default 1000 for latency tests, 5000 for bandwidth tests)")
	set.BoolVar(&o.all, "a", false, "sweep sizes 8 B .. 1 MiB in powers of 2")
	set.IntVar(&o.outstanding, "t", 1, "operations outstanding (bandwidth tests)")
	set.Float64Var(&o.duration, "D", 0, "run each size for this many seconds instead of -n iterations")
	set.BoolVar(&o.json, "json", false, "print the results as JSON instead of tables")
	set.StringVar(&o.meta, "meta", "", "API mode: meta service HOST:PORT[,HOST:PORT...] of the cluster")
	set.UintVar(&o.gid, "gid", 0, "API mode: gid of the node to benchmark against")
	set.StringVar(&o.listen, "listen", "127.0.0.1:0", "API mode: address of the bench process's own software NIC")
	set.BoolVar(&o.register, "register", false, "API mode: register the bench node with the meta service (deregistered at exit)")
	set.StringVar(&o.path, "path", "", "file mode: a region file (or, for send_lat, a port file) of a mounted krfs")
	set.StringVar(&o.region, "region", "mem", "API mode: the peer's region")
	set.UintVar(&o.port, "port", 1, "API mode, send_lat: the peer's port (someone must be reading it)")
	set.BoolVar(&o.baseline, "baseline", false, "also measure the matching same-run baseline (UDP ping-pong, sendmmsg echo, TCP) and print ratios")
	set.StringVar(&o.progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on, off")
	set.StringVar(&o.transport, "transport", "auto", "API mode: auto (qpcore's hybrid policy), dc (never switch to RC), rc (make the peer hot first and wait for its RC QP)")
	set.DurationVar(&o.timeout, "timeout", 10*time.Second, "give up on one operation after this long")
	set.Usage = func() {
		fmt.Fprintln(stderr, "usage: krfs bench TEST [flags]  (API mode: --meta HOST:PORT --gid N; file mode: --path FILE)")
		fmt.Fprintln(stderr, "tests:")
		for _, t := range benchTests {
			fmt.Fprintf(stderr, "  %-12s %s\n", t.name, t.help)
		}
		fmt.Fprintln(stderr, "  report DIR   (for scripts/bench.sh) write DIR/results.{json,md} and plots from DIR/raw")
		fmt.Fprintln(stderr, "flags:")
		set.PrintDefaults()
	}
	pos, err := parseInterleaved(set, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		set.Usage()
		return nil, fmt.Errorf("%w: one TEST expected, got %d", errUsage, len(pos))
	}
	o.test = pos[0]
	if err := o.validate(); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *benchOpts) validate() error {
	known := false
	var names []string
	for _, t := range benchTests {
		names = append(names, t.name)
		known = known || t.name == o.test
	}
	if !known {
		return fmt.Errorf("%w: unknown test %q; tests: %s", errUsage, o.test, strings.Join(names, ", "))
	}
	noop := o.test == "fuse_noop_lat"
	switch {
	case noop && (o.path != "" || o.meta != "" || o.gid != 0):
		return fmt.Errorf("%w: fuse_noop_lat mounts its own file; no --path, --meta or --gid", errUsage)
	case noop:
	case o.path != "" && o.meta != "":
		return fmt.Errorf("%w: --path (file mode) and --meta (API mode) exclude each other", errUsage)
	case o.path == "" && o.meta == "":
		return fmt.Errorf("%w: give --meta HOST:PORT --gid N (API mode) or --path FILE (file mode)", errUsage)
	case o.meta != "" && o.gid == 0:
		return fmt.Errorf("%w: API mode needs --gid N, the node to benchmark against", errUsage)
	case o.path != "" && o.gid != 0:
		return fmt.Errorf("%w: --gid is for API mode; in file mode the path names the peer", errUsage)
	case o.test == "meta_lookup" && o.path != "":
		return fmt.Errorf("%w: meta_lookup runs in API mode only (--meta, --gid)", errUsage)
	case o.test == "fullmesh" && o.path != "":
		return fmt.Errorf("%w: fullmesh runs in API mode only (--meta, --gid)", errUsage)
	}
	if o.iters < 0 || o.duration < 0 || o.duration > 3600 {
		return fmt.Errorf("%w: -n and -D must be positive (-D at most 3600)", errUsage)
	}
	if o.iters > 0 && o.duration > 0 {
		return fmt.Errorf("%w: -n and -D exclude each other", errUsage)
	}
	if o.iters == 0 {
		o.iters = 1000
		if o.isBW() {
			o.iters = 5000
		}
	}
	if o.outstanding < 1 || o.outstanding > 1024 {
		return fmt.Errorf("%w: -t %d: want 1..1024", errUsage, o.outstanding)
	}
	if o.outstanding > 1 && !o.isBW() {
		return fmt.Errorf("%w: -t applies to read_bw and write_bw; latency tests keep one operation outstanding", errUsage)
	}
	switch o.transport {
	case "auto", "dc", "rc":
	default:
		return fmt.Errorf("%w: --transport %q: want auto, dc or rc", errUsage, o.transport)
	}
	if o.transport != "auto" && o.path != "" {
		return fmt.Errorf("%w: --transport applies to API mode", errUsage)
	}
	switch o.progress {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("%w: --progress %q: want auto, on or off", errUsage, o.progress)
	}
	sized := o.isLat() || o.isBW()
	if o.all && (!sized || o.test == "atomic_lat") {
		return fmt.Errorf("%w: -a applies to read_*, write_* and send_lat", errUsage)
	}
	if o.sizeStr != "" {
		if !sized {
			return fmt.Errorf("%w: -s does not apply to %s", errUsage, o.test)
		}
		if o.all {
			return fmt.Errorf("%w: -s and -a exclude each other", errUsage)
		}
		v, err := parseSize(o.sizeStr)
		if err != nil {
			return err
		}
		o.size = v
	}
	switch {
	case o.test == "atomic_lat":
		if o.size != 0 && o.size != 8 {
			return fmt.Errorf("%w: atomics are 8 bytes; -s %s", errUsage, o.sizeStr)
		}
		o.size = 8
	case o.size == 0 && o.isBW():
		o.size = 1 << 20
	case o.size == 0:
		o.size = 8
	}
	if o.size < 1 || o.size > 1<<30 {
		return fmt.Errorf("%w: -s %s: want 1 byte to 1G", errUsage, o.sizeStr)
	}
	return nil
}

// sizes are the message sizes to run.
func (o *benchOpts) sizes() []int {
	if !o.all {
		return []int{int(o.size)}
	}
	var s []int
	for n := sweepMin; n <= sweepMax; n *= 2 {
		s = append(s, n)
	}
	return s
}

// itersFor is the iteration count for one size of a sweep: bandwidth
// sweeps move at most 256 MiB per size so that -a stays short.
func (o *benchOpts) itersFor(size int) int {
	if o.all && o.isBW() {
		return min(o.iters, max(64, (256<<20)/size))
	}
	return o.iters
}

// latRow is one line of a latency table; times are in microseconds.
type latRow struct {
	Label      string  `json:"label,omitempty"`
	Bytes      int     `json:"bytes"`
	Iterations int     `json:"iterations"`
	MinUs      float64 `json:"t_min_us"`
	MaxUs      float64 `json:"t_max_us"`
	TypicalUs  float64 `json:"t_typical_us"`
	AvgUs      float64 `json:"t_avg_us"`
	StdevUs    float64 `json:"t_stdev_us"`
	P99Us      float64 `json:"p99_us"`
	P999Us     float64 `json:"p99_9_us"`
	sum        baseline.Summary
}

func us(d time.Duration) float64 { return math.Round(float64(d)/1e1) / 1e2 }

func newLatRow(label string, bytes int, l baseline.Latencies) latRow {
	s := l.Summary()
	return latRow{Label: label, Bytes: bytes, Iterations: s.N, MinUs: us(s.Min), MaxUs: us(s.Max),
		TypicalUs: us(s.Typical), AvgUs: us(s.Avg), StdevUs: us(s.Stdev), P99Us: us(s.P99), P999Us: us(s.P999), sum: s}
}

// bwRow is one line of a bandwidth table.
type bwRow struct {
	Bytes       int     `json:"bytes"`
	Iterations  int     `json:"iterations"`
	PeakMiBs    float64 `json:"bw_peak_mib_s"`
	AvgMiBs     float64 `json:"bw_avg_mib_s"`
	MsgRateMpps float64 `json:"msg_rate_mpps"`
}

// BWHeader is the header of perftest's bandwidth tables.
const BWHeader = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"

func (r bwRow) String() string {
	return fmt.Sprintf(" %-10d %-14d %-19.2f %-21.2f %.6f", r.Bytes, r.Iterations, r.PeakMiBs, r.AvgMiBs, r.MsgRateMpps)
}

// newBWRow computes a bandwidth row from the completion times of the
// operations, relative to the start: the average over the whole run and
// the peak over the best window of a tenth of the run (at least twice
// outstanding operations).
func newBWRow(bytes int, done []time.Duration, outstanding int) bwRow {
	n := len(done)
	r := bwRow{Bytes: bytes, Iterations: n}
	if n == 0 {
		return r
	}
	slices.Sort(done)
	total := done[n-1].Seconds()
	if total <= 0 {
		return r
	}
	mib := float64(bytes) / (1 << 20)
	r.AvgMiBs = float64(n) * mib / total
	r.MsgRateMpps = float64(n) / total / 1e6
	r.PeakMiBs = r.AvgMiBs
	w := max(n/10, 2*outstanding, 1)
	for i := 0; i+w < n; i++ {
		if d := (done[i+w] - done[i]).Seconds(); d > 0 {
			r.PeakMiBs = max(r.PeakMiBs, float64(w)*mib/d)
		}
	}
	return r
}

// baseRow is a same-run baseline beside a krfs figure.
type baseRow struct {
	Bytes    int     `json:"bytes"`
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Krfs     float64 `json:"krfs"`
	Baseline float64 `json:"baseline"`
	// Ratio is krfs over the baseline: for latencies >1 is slower, for
	// rates <1 is slower.
	Ratio float64 `json:"ratio"`
}

// benchReport is what one `krfs bench` run prints.
type benchReport struct {
	Test        string     `json:"test"`
	Mode        string     `json:"mode"`
	Target      string     `json:"target"`
	Outstanding int        `json:"outstanding"`
	Tables      []latTable `json:"latency,omitempty"`
	Bandwidth   []bwRow    `json:"bandwidth,omitempty"`
	Baselines   []baseRow  `json:"baselines,omitempty"`
	Notes       []string   `json:"notes,omitempty"`
}

// latTable is a latency table with a title (connect and meta_lookup have
// one per variant).
type latTable struct {
	Title string   `json:"title"`
	Rows  []latRow `json:"rows"`
}

func (r *benchReport) addLat(title string, row latRow) {
	for i := range r.Tables {
		if r.Tables[i].Title == title {
			r.Tables[i].Rows = append(r.Tables[i].Rows, row)
			return
		}
	}
	r.Tables = append(r.Tables, latTable{Title: title, Rows: []latRow{row}})
}

func (r *benchReport) write(w io.Writer, asJSON bool) error {
	if asJSON {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(r)
	}
	rule := strings.Repeat("-", 100)
	fmt.Fprintln(w, rule)
	fmt.Fprintf(w, "                    krfs bench %s (%s mode)\n", r.Test, r.Mode)
	fmt.Fprintf(w, " target: %s\n", r.Target)
	if r.Outstanding > 1 {
		fmt.Fprintf(w, " outstanding: %d\n", r.Outstanding)
	}
	for _, t := range r.Tables {
		fmt.Fprintln(w, rule)
		fmt.Fprintf(w, " %s\n", t.Title)
		fmt.Fprintln(w, baseline.LatencyHeader)
		for _, row := range t.Rows {
			fmt.Fprintln(w, row.sum.Row(row.Bytes))
		}
	}
	if len(r.Bandwidth) > 0 {
		fmt.Fprintln(w, rule)
		fmt.Fprintln(w, BWHeader)
		for _, row := range r.Bandwidth {
			fmt.Fprintln(w, row)
		}
	}
	fmt.Fprintln(w, rule)
	if len(r.Baselines) > 0 {
		fmt.Fprintln(w, " same-run baselines:")
		for _, b := range r.Baselines {
			fmt.Fprintf(w, "  %-8d %-40s krfs %10.2f  baseline %10.2f %-8s ratio %.3gx\n", b.Bytes, b.Name, b.Krfs, b.Baseline, b.Unit, b.Ratio)
		}
		fmt.Fprintln(w, rule)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, " note: %s\n", n)
	}
	return nil
}

// progress draws a bar on stderr for runs longer than a second.
type progress struct {
	w       io.Writer
	label   string
	start   time.Time
	last    time.Time
	drawn   bool
	enabled bool
}

func newProgress(w io.Writer, mode string) *progress {
	on := mode == "on"
	if mode == "auto" {
		if f, ok := w.(*os.File); ok {
			_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
			on = err == nil
		}
	}
	return &progress{w: w, enabled: on}
}

func (p *progress) begin(label string) {
	p.label, p.start, p.last = label, time.Now(), time.Time{}
}

// update reports the fraction done (0..1).
func (p *progress) update(frac float64) {
	if !p.enabled {
		return
	}
	now := time.Now()
	if now.Sub(p.start) < time.Second || now.Sub(p.last) < 200*time.Millisecond {
		return
	}
	p.last = now
	frac = min(max(frac, 0), 1)
	const width = 30
	k := int(frac * width)
	fmt.Fprintf(p.w, "\r%s [%s%s] %3.0f%% %4.0fs", p.label, strings.Repeat("#", k), strings.Repeat(".", width-k), frac*100, now.Sub(p.start).Seconds())
	p.drawn = true
}

func (p *progress) end() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// runBench is `krfs bench`.
func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "report" {
		if len(args) != 2 {
			return fmt.Errorf("%w: bench report DIR", errUsage)
		}
		return benchReportDir(args[1], stdout)
	}
	o, err := parseBenchArgs(args, stderr)
	if err != nil {
		return err
	}
	var t benchTarget
	if o.test == "fuse_noop_lat" {
		size := slices.Max(o.sizes())
		path, unmount, err := mountNoop(size)
		if err != nil {
			return err
		}
		defer unmount()
		o.path = path
	}
	if o.apiMode() {
		t, err = openAPITarget(o)
	} else {
		t, err = openFileTarget(o)
	}
	if err != nil {
		return err
	}
	defer t.close()
	r, err := runBenchTest(o, t, newProgress(stderr, o.progress))
	if err != nil {
		return err
	}
	if a, ok := t.(*apiTarget); ok && a.v != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("VQP transport at the end: %v", a.v.Transport()))
	}
	return r.write(stdout, o.json)
}
