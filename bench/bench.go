// Package bench is the benchmark suite of `krfs bench`: perftest-style
// latency and bandwidth tests through the Go API against a node of a
// running cluster (a fresh bench node started with package node), or
// through the file interface of a mounted krfs, each beside a baseline
// measured in the same run (package bench/baseline).
//
// Open a Target for validated Opts, Run the test against it, and Write
// the Report. Package report turns many runs into the suite's results.
package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/krfs/krfs/nic"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/bench/baseline"
)

// ErrUsage marks errors in the options: the command prints its usage.
var ErrUsage = errors.New("usage")

// Tests are the benchmarks `krfs bench` runs, with a line of help each.
var Tests = []struct{ Name, Help string }{
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

// Opts are the options of one benchmark run (the flags of `krfs bench`).
// Validate checks them and fills in the defaults.
type Opts struct {
	Test        string
	SizeStr     string
	Size        int64
	Iters       int
	All         bool
	Outstanding int
	Duration    float64 // seconds; 0: -n iterations
	JSON        bool
	Meta        string
	GID         uint
	Listen      string
	Register    bool
	Path        string
	Region      string
	Port        uint
	Baseline    bool
	// BaselineEcho and BaselineFloor choose the baseline of a latency
	// test (--baseline-echo, --baseline-floor; either implies Baseline).
	// By default it is a UDP ping-pong on 127.0.0.1 with its own echo.
	// BaselineEcho is the IP:PORT of a UDP echo server elsewhere
	// (krfs-baseline serve): the ping-pong crosses the same network as
	// krfs. BaselineFloor is a file whose pread is the baseline (the FUSE
	// floor of krfs-baseline floor).
	BaselineEcho  string
	BaselineFloor string
	// BaselineMetaEcho (--baseline-meta-echo), with BaselineEcho, makes
	// the connect test's baseline the cold pair (baseline.ColdPair): a
	// round trip to this echo on the meta service's host, then one to
	// BaselineEcho on the peer's host, after every cold connect + first
	// READ.
	BaselineMetaEcho string
	Progress         string // auto, on, off
	Timeout          time.Duration
	Transport        string // API mode: auto, dc, rc
	// NIC says which device API mode opens (--backend, --device,
	// --device-port, --gid-index and the QoS flags); its Listen is
	// Opts.Listen.
	NIC nic.Options
}

func (o *Opts) IsLat() bool   { return strings.HasSuffix(o.Test, "_lat") }
func (o *Opts) IsBW() bool    { return strings.HasSuffix(o.Test, "_bw") }
func (o *Opts) APIMode() bool { return o.Path == "" && o.Test != "fuse_noop_lat" }

func (o *Opts) Mode() string {
	if o.APIMode() {
		return "api"
	}
	return "file"
}

const (
	sweepMin = 8
	sweepMax = 1 << 20
)

func (o *Opts) Validate() error {
	known := false
	var names []string
	for _, t := range Tests {
		names = append(names, t.Name)
		known = known || t.Name == o.Test
	}
	if !known {
		return fmt.Errorf("%w: unknown test %q; tests: %s", ErrUsage, o.Test, strings.Join(names, ", "))
	}
	noop := o.Test == "fuse_noop_lat"
	switch {
	case noop && (o.Path != "" || o.Meta != "" || o.GID != 0):
		return fmt.Errorf("%w: fuse_noop_lat mounts its own file; no --path, --meta or --gid", ErrUsage)
	case noop:
	case o.Path != "" && o.Meta != "":
		return fmt.Errorf("%w: --path (file mode) and --meta (API mode) exclude each other", ErrUsage)
	case o.Path == "" && o.Meta == "":
		return fmt.Errorf("%w: give --meta HOST:PORT --gid N (API mode) or --path FILE (file mode)", ErrUsage)
	case o.Meta != "" && o.GID == 0:
		return fmt.Errorf("%w: API mode needs --gid N, the node to benchmark against", ErrUsage)
	case o.Path != "" && o.GID != 0:
		return fmt.Errorf("%w: --gid is for API mode; in file mode the path names the peer", ErrUsage)
	case o.Test == "meta_lookup" && o.Path != "":
		return fmt.Errorf("%w: meta_lookup runs in API mode only (--meta, --gid)", ErrUsage)
	case o.Test == "fullmesh" && o.Path != "":
		return fmt.Errorf("%w: fullmesh runs in API mode only (--meta, --gid)", ErrUsage)
	}
	if o.Iters < 0 || o.Duration < 0 || o.Duration > 3600 {
		return fmt.Errorf("%w: -n and -D must be positive (-D at most 3600)", ErrUsage)
	}
	if o.Iters > 0 && o.Duration > 0 {
		return fmt.Errorf("%w: -n and -D exclude each other", ErrUsage)
	}
	if o.Iters == 0 {
		o.Iters = 1000
		if o.IsBW() {
			o.Iters = 5000
		}
	}
	if o.Outstanding < 1 || o.Outstanding > 1024 {
		return fmt.Errorf("%w: -t %d: want 1..1024", ErrUsage, o.Outstanding)
	}
	if o.Outstanding > 1 && !o.IsBW() {
		return fmt.Errorf("%w: -t applies to read_bw and write_bw; latency tests keep one operation outstanding", ErrUsage)
	}
	if err := o.validateBaseline(); err != nil {
		return err
	}
	switch o.Transport {
	case "auto", "dc", "rc":
	default:
		return fmt.Errorf("%w: --transport %q: want auto, dc or rc", ErrUsage, o.Transport)
	}
	if o.Transport != "auto" && o.Path != "" {
		return fmt.Errorf("%w: --transport applies to API mode", ErrUsage)
	}
	switch o.Progress {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("%w: --progress %q: want auto, on or off", ErrUsage, o.Progress)
	}
	sized := o.IsLat() || o.IsBW()
	if o.All && (!sized || o.Test == "atomic_lat") {
		return fmt.Errorf("%w: -a applies to read_*, write_* and send_lat", ErrUsage)
	}
	if o.SizeStr != "" {
		if !sized {
			return fmt.Errorf("%w: -s does not apply to %s", ErrUsage, o.Test)
		}
		if o.All {
			return fmt.Errorf("%w: -s and -a exclude each other", ErrUsage)
		}
	}
	switch {
	case o.Test == "atomic_lat":
		if o.Size != 0 && o.Size != 8 {
			return fmt.Errorf("%w: atomics are 8 bytes; -s %s", ErrUsage, o.SizeStr)
		}
		o.Size = 8
	case o.Size == 0 && o.IsBW():
		o.Size = 1 << 20
	case o.Size == 0:
		o.Size = 8
	}
	if o.Size < 1 || o.Size > 1<<30 {
		return fmt.Errorf("%w: -s %s: want 1 byte to 1G", ErrUsage, o.SizeStr)
	}
	return nil
}

// validateBaseline checks --baseline-echo and --baseline-floor.
func (o *Opts) validateBaseline() error {
	if o.BaselineEcho == "" && o.BaselineFloor == "" && o.BaselineMetaEcho == "" {
		return nil
	}
	if o.Test == "connect" || o.BaselineMetaEcho != "" {
		return o.validateColdPair()
	}
	switch {
	case o.BaselineEcho != "" && o.BaselineFloor != "":
		return fmt.Errorf("%w: --baseline-echo and --baseline-floor exclude each other", ErrUsage)
	case !o.IsLat():
		return fmt.Errorf("%w: --baseline-echo and --baseline-floor apply to latency tests (*_lat)", ErrUsage)
	case o.Duration > 0:
		return fmt.Errorf("%w: --baseline-echo and --baseline-floor alternate with -n iterations; -D is not supported", ErrUsage)
	}
	if o.BaselineEcho != "" {
		if _, err := netip.ParseAddrPort(o.BaselineEcho); err != nil {
			return fmt.Errorf("%w: --baseline-echo %q: want IP:PORT (%v)", ErrUsage, o.BaselineEcho, err)
		}
	}
	o.Baseline = true
	return nil
}

// validateColdPair checks the echoes of connect's cold-pair baseline.
func (o *Opts) validateColdPair() error {
	switch {
	case o.Test != "connect":
		return fmt.Errorf("%w: --baseline-meta-echo applies to the connect test", ErrUsage)
	case o.BaselineFloor != "":
		return fmt.Errorf("%w: connect: --baseline-floor does not apply (--baseline-echo PEER_ECHO --baseline-meta-echo META_ECHO)", ErrUsage)
	case o.BaselineEcho == "" || o.BaselineMetaEcho == "":
		return fmt.Errorf("%w: connect: the cold pair needs both --baseline-echo (on the peer's host) and --baseline-meta-echo (on the meta service's host)", ErrUsage)
	case o.Path != "":
		return fmt.Errorf("%w: connect: the cold-pair baseline is for API mode (--meta, --gid)", ErrUsage)
	case o.Duration > 0:
		return fmt.Errorf("%w: connect: the cold pair alternates with -n iterations; -D is not supported", ErrUsage)
	}
	for _, a := range []struct{ flag, v string }{{"--baseline-echo", o.BaselineEcho}, {"--baseline-meta-echo", o.BaselineMetaEcho}} {
		if _, err := netip.ParseAddrPort(a.v); err != nil {
			return fmt.Errorf("%w: %s %q: want IP:PORT (%v)", ErrUsage, a.flag, a.v, err)
		}
	}
	o.Baseline = true
	return nil
}

// Sizes are the message sizes to run.
func (o *Opts) Sizes() []int {
	if !o.All {
		return []int{int(o.Size)}
	}
	var s []int
	for n := sweepMin; n <= sweepMax; n *= 2 {
		s = append(s, n)
	}
	return s
}

// ItersFor is the iteration count for one size of a sweep: bandwidth
// sweeps move at most 256 MiB per size so that -a stays short.
func (o *Opts) ItersFor(size int) int {
	if o.All && o.IsBW() {
		return min(o.Iters, max(64, (256<<20)/size))
	}
	return o.Iters
}

// LatRow is one line of a latency table; times are in microseconds.
type LatRow struct {
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

// NewLatRow summarizes latencies l of bytes-byte operations.
func NewLatRow(label string, bytes int, l baseline.Latencies) LatRow {
	s := l.Summary()
	return LatRow{Label: label, Bytes: bytes, Iterations: s.N, MinUs: us(s.Min), MaxUs: us(s.Max),
		TypicalUs: us(s.Typical), AvgUs: us(s.Avg), StdevUs: us(s.Stdev), P99Us: us(s.P99), P999Us: us(s.P999), sum: s}
}

// BWRow is one line of a bandwidth table.
type BWRow struct {
	Bytes       int     `json:"bytes"`
	Iterations  int     `json:"iterations"`
	PeakMiBs    float64 `json:"bw_peak_mib_s"`
	AvgMiBs     float64 `json:"bw_avg_mib_s"`
	MsgRateMpps float64 `json:"msg_rate_mpps"`
}

// BWHeader is the header of perftest's bandwidth tables.
const BWHeader = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"

func (r BWRow) String() string {
	return fmt.Sprintf(" %-10d %-14d %-19.2f %-21.2f %.6f", r.Bytes, r.Iterations, r.PeakMiBs, r.AvgMiBs, r.MsgRateMpps)
}

// newBWRow computes a bandwidth row from the completion times of the
// operations, relative to the start: the average over the whole run and
// the peak over the best window of a tenth of the run (at least twice
// outstanding operations).
func newBWRow(bytes int, done []time.Duration, outstanding int) BWRow {
	n := len(done)
	r := BWRow{Bytes: bytes, Iterations: n}
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

// BaseRow is a same-run baseline beside a krfs figure.
type BaseRow struct {
	Bytes    int     `json:"bytes"`
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Krfs     float64 `json:"krfs"`
	Baseline float64 `json:"baseline"`
	// Ratio is krfs over the baseline: for latencies >1 is slower, for
	// rates <1 is slower.
	Ratio float64 `json:"ratio"`
}

// Report is what one `krfs bench` run prints.
type Report struct {
	Test        string     `json:"test"`
	Mode        string     `json:"mode"`
	Target      string     `json:"target"`
	Outstanding int        `json:"outstanding"`
	Tables      []LatTable `json:"latency,omitempty"`
	Bandwidth   []BWRow    `json:"bandwidth,omitempty"`
	Baselines   []BaseRow  `json:"baselines,omitempty"`
	Notes       []string   `json:"notes,omitempty"`
}

// LatTable is a latency table with a title (connect and meta_lookup have
// one per variant).
type LatTable struct {
	Title string   `json:"title"`
	Rows  []LatRow `json:"rows"`
}

// AddLat appends row to the latency table titled title, creating it.
func (r *Report) AddLat(title string, row LatRow) {
	for i := range r.Tables {
		if r.Tables[i].Title == title {
			r.Tables[i].Rows = append(r.Tables[i].Rows, row)
			return
		}
	}
	r.Tables = append(r.Tables, LatTable{Title: title, Rows: []LatRow{row}})
}

// Write prints r as perftest-style tables, or as JSON.
func (r *Report) Write(w io.Writer, asJSON bool) error {
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

// Progress draws a bar on stderr for runs longer than a second.
type Progress struct {
	w       io.Writer
	label   string
	start   time.Time
	last    time.Time
	drawn   bool
	enabled bool
}

// NewProgress returns a progress bar on w: mode is auto (when w is a
// terminal), on or off.
func NewProgress(w io.Writer, mode string) *Progress {
	on := mode == "on"
	if mode == "auto" {
		if f, ok := w.(*os.File); ok {
			_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
			on = err == nil
		}
	}
	return &Progress{w: w, enabled: on}
}

func (p *Progress) begin(label string) {
	p.label, p.start, p.last = label, time.Now(), time.Time{}
}

// update reports the fraction done (0..1).
func (p *Progress) update(frac float64) {
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

func (p *Progress) end() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}
