package node

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
)

// scrape returns the metric samples of a /metrics page, keyed by the
// sample's name and labels as printed.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape %s: %v %s", url, err, resp.Status)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func TestMetricsAfterTraffic(t *testing.T) {
	d := testNode(t)
	ops := NewOpMetrics()
	log := logrus.New()
	log.SetOutput(io.Discard)
	addr, stop, err := ServeMetrics(log, "127.0.0.1:0", Registry(d, ops))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	url := "http://" + addr.String() + "/metrics"

	before := scrape(t, url)
	if before[`krfs_regions`] != 1 || before[`krfs_region_bytes{region="mem"}`] != 1<<20 {
		t.Fatalf("regions before traffic: %v %v", before[`krfs_regions`], before[`krfs_region_bytes{region="mem"}`])
	}

	b := Metered(d, ops)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	self := d.Self()
	c, err := b.Connect(ctx, self)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := 0; i < 10; i++ {
		if _, err := c.WriteAt(ctx, "mem", buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReadAt(ctx, "mem", buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.FetchAdd(ctx, "mem", 0, 1); err != nil {
		t.Fatal(err)
	}
	// Out of bounds: refused by the pre-check, counted as a failure.
	if _, err := c.ReadAt(ctx, "mem", buf, 1<<20); err == nil {
		t.Fatal("a read past the region succeeded")
	}
	c.Close()
	if _, err := d.Export("extra", 64<<10, 0o600, 0, 0); err != nil {
		t.Fatal(err)
	}

	after := scrape(t, url)
	sum := func(m map[string]float64, prefix string) float64 {
		var s float64
		for k, v := range m {
			if strings.HasPrefix(k, prefix) {
				s += v
			}
		}
		return s
	}
	checks := []struct {
		name     string
		min      float64
		got, was float64
	}{
		{"reads", 10, sum(after, `krfs_ops_total{op="read"`), sum(before, `krfs_ops_total{op="read"`)},
		{"writes", 10, sum(after, `krfs_ops_total{op="write"`), sum(before, `krfs_ops_total{op="write"`)},
		{"fetch_add", 1, sum(after, `krfs_ops_total{op="fetch_add"`), 0},
		{"read bytes", 10 * 4096, sum(after, `krfs_op_bytes_total{op="read"`), 0},
		{"read latency count", 11, after[`krfs_op_duration_seconds_count{op="read"}`], 0},
		{"read failures", 1, after[`krfs_op_failures_total{op="read"}`], 0},
		{"connects", 1, sum(after, `krfs_connects_total`), sum(before, `krfs_connects_total`)},
		{"wrs posted", 21, sum(after, `krfs_wrs_posted_total`), sum(before, `krfs_wrs_posted_total`)},
		{"pre-check rejects", 1, sum(after, `krfs_precheck_rejects_total`), sum(before, `krfs_precheck_rejects_total`)},
		{"nic tx packets", 20, after[`krfs_nic_packets_total{direction="tx"}`], before[`krfs_nic_packets_total{direction="tx"}`]},
		{"meta lookups", 1, sum(after, `krfs_meta_client_total{event="lookup"}`), sum(before, `krfs_meta_client_total{event="lookup"}`)},
		{"regions", 1, after[`krfs_regions`], before[`krfs_regions`]},
	}
	for _, c := range checks {
		if c.got-c.was < c.min {
			t.Errorf("%s moved by %v (from %v to %v), want at least %v", c.name, c.got-c.was, c.was, c.got, c.min)
		}
	}
	// The link's errors are exported even while zero (a dashboard needs
	// the series before the first error); softnic's
	// TestDeviceStatsReportLinkErrors checks the values.
	for _, k := range []string{`krfs_nic_tx_errors_total{reason="dropped"}`, `krfs_nic_tx_errors_total{reason="refused"}`,
		`krfs_nic_rx_errors_total`} {
		if _, ok := after[k]; !ok {
			t.Errorf("metric %s missing", k)
		}
	}
	if after[`krfs_region_bytes{region="extra"}`] != 64<<10 {
		t.Errorf("region extra: %v bytes", after[`krfs_region_bytes{region="extra"}`])
	}
	// Labels print sorted by name: state before type.
	var dct float64
	for k, v := range after {
		if strings.HasPrefix(k, "krfs_nic_qps{") && strings.HasSuffix(k, `type="DCT"}`) {
			dct += v
		}
	}
	if after[`krfs_nic_qps{state="RTS",type="DCI"}`] < 1 || dct < 1 {
		t.Errorf("QPs: DCIs in RTS %v, DCTs %v", after[`krfs_nic_qps{state="RTS",type="DCI"}`], dct)
	}
}

// TestPprofServed checks that the metrics server answers the Go runtime's
// heap profile and the pprof index, which is what an operator uses to see
// what a running daemon's memory holds.
func TestPprofServed(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	addr, stop, err := ServeMetrics(log, "127.0.0.1:0", prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for path, want := range map[string]string{
		"/debug/pprof/":               "heap",
		"/debug/pprof/heap?debug=1":   "heap profile:",
		"/debug/pprof/allocs?debug=1": "heap profile:",
	} {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %v %s, body without %q: %.200s", path, err, resp.Status, want, body)
		}
	}
}

// Every figure of qpcore's stat table is both in stats.json (the Node
// object, under its field name) and a metric (its name and label value),
// with the same value.
func TestStatTable(t *testing.T) {
	d := testNode(t)
	// Some traffic, so that the values are not all zero.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.Connect(ctx, d.Self())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := c.ReadAt(ctx, "mem", buf, 0); err != nil {
		t.Fatal(err)
	}
	c.Close()

	// stats.json and the metrics are read one after the other: the node's
	// background work (meta, housekeeping) may move a figure in between,
	// so a mismatch is looked at again (presence is not).
	var s qpcore.Stats
	n := 0
	for try := 0; ; try++ {
		mismatch := compareStatTable(t, d, &s, &n, try == 4)
		if !mismatch {
			break
		}
	}
	if n < 70 || s.OpsDC+s.OpsRC == 0 {
		t.Fatalf("%d figures, %d WRs posted: the table or the traffic is missing", n, s.OpsDC+s.OpsRC)
	}
}

// compareStatTable reads stats.json and the metrics of d once, reports
// every table figure missing from either, and reports (if final) or
// returns whether a value differs.
func compareStatTable(t *testing.T, d *Node, s *qpcore.Stats, n *int, final bool) bool {
	t.Helper()
	var js bytes.Buffer
	if err := d.Stats(&js, true); err != nil {
		t.Fatal(err)
	}
	var doc struct{ Node json.RawMessage }
	var node map[string]float64
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(doc.Node, &node); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(doc.Node, s); err != nil {
		t.Fatal(err)
	}
	fams, err := Registry(d, NewOpMetrics()).Gather()
	if err != nil {
		t.Fatal(err)
	}
	samples := map[string]float64{} // "name{label=value}"
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			if lp := m.GetLabel(); len(lp) == 1 {
				key += "{" + lp[0].GetName() + "=" + lp[0].GetValue() + "}"
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			samples[key] = v
		}
	}
	*n = 0
	mismatch := false
	for _, m := range qpcore.StatMetrics() {
		for i := range m.Fields {
			f := &m.Fields[i]
			*n++
			jv, ok := node[f.Field]
			if !ok {
				t.Errorf("stats.json has no Node.%s", f.Field)
			}
			key := "krfs_" + m.Name
			if m.Label != "" {
				key += "{" + m.Label + "=" + f.Value + "}"
			}
			mv, ok := samples[key]
			if !ok {
				t.Errorf("no metric %s for %s", key, f.Field)
				continue
			}
			if want := f.Of(s); mv != want {
				mismatch = true
				if final {
					t.Errorf("%s = %v, stats.json's %s gives %v (field %v)", key, mv, f.Field, want, jv)
				}
			}
		}
	}
	return mismatch && !final
}
