// Package report is `krfs bench report DIR`: it reads what scripts/bench.sh
// left in DIR/raw — `go test -bench` outputs (*.txt) and `krfs bench
// --json` outputs (*.json) — and writes DIR/results.json, DIR/results.md
// (also printed) and SVG plots. Every row sets a krfs figure beside a
// baseline measured in the same run; targets are the ones stated in the
// issues. The rows are data: rowTable (rows.go) lists each one with where
// its figure and baseline come from and how they are judged.
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
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/krfs/krfs/bench"
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

// missing records what as not measured in this run (once).
func (s *suite) missing(what string) {
	if !slices.Contains(s.res.Missing, what) {
		s.res.Missing = append(s.res.Missing, what)
	}
}

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
