package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/bench/baseline"
)

func TestBenchTables(t *testing.T) {
	var lat baseline.Latencies
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Microsecond)
	}
	r := &Report{Test: "read_lat", Mode: "api", Target: "x"}
	r.AddLat(LatTitle("read_lat"), NewLatRow("", 8, lat))
	r.AddLat(LatTitle("read_lat"), NewLatRow("", 16, lat))
	r.Baselines = []BaseRow{{Bytes: 8, Name: "udp_pingpong p50", Unit: "usec", Krfs: 50.5, Baseline: 10, Ratio: 5.05}}
	var out bytes.Buffer
	r.Write(&out, false)
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
	r.Write(&out, true)
	var back Report
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

// TestAlternateWarmsUpEachChunk checks that every chunk of ours starts
// with baseline.Warmup untimed operations, as every chunk of the baseline
// does, that only the timed ones are returned, and that an error of a
// warm-up operation stops the run.
func TestAlternateWarmsUpEachChunk(t *testing.T) {
	const n = 1000
	var trace []int // per chunk: operations of ours, then -k for a baseline chunk of k
	ops := 0
	op := func() error { ops++; return nil }
	base := &latBase{measure: func(k int) (baseline.Latencies, error) {
		trace = append(trace, ops, -k)
		ops = 0
		return make(baseline.Latencies, k), nil
	}, rounds: baseline.RemoteRounds}
	lat, bl, err := alternate(n, op, base, func(int, time.Time) {})
	if err != nil {
		t.Fatal(err)
	}
	if len(lat) != n || len(bl) != n {
		t.Fatalf("%d latencies of ours and %d of the baseline, want %d each", len(lat), len(bl), n)
	}
	rounds := baseline.RemoteRounds(n)
	if len(trace) != 2*rounds {
		t.Fatalf("%d chunks, want %d", len(trace)/2, rounds)
	}
	for i := 0; i < len(trace); i += 2 {
		if k := -trace[i+1]; trace[i] != baseline.Warmup+k {
			t.Fatalf("chunk %d: %d operations of ours before a baseline chunk of %d, want %d", i/2, trace[i], k, baseline.Warmup+k)
		}
	}

	boom := errors.New("boom")
	calls := 0
	failing := func() error {
		if calls++; calls == n/rounds+baseline.Warmup+1 { // the second chunk's first warm-up
			return boom
		}
		return nil
	}
	if _, _, err := alternate(n, failing, base, func(int, time.Time) {}); !errors.Is(err, boom) {
		t.Fatalf("a failing warm-up operation: %v", err)
	}
}

// TestLatBaselineRounds checks that each kind of latency baseline
// alternates in the rounds its A/A tests chose (baseline.AlternateWith):
// chunks of baseline.LocalChunkOps for the in-process ping-pong, of
// baseline.ChunkOps for a server in another process.
func TestLatBaselineRounds(t *testing.T) {
	floor := filepath.Join(t.TempDir(), "floor")
	if err := os.WriteFile(floor, make([]byte, 8), 0o600); err != nil {
		t.Fatal(err)
	}
	const n = 100 * baseline.ChunkOps
	for _, c := range []struct {
		o    Opts
		want int
	}{
		{Opts{Baseline: true}, max(10, n/baseline.LocalChunkOps)},
		{Opts{Baseline: true, BaselineEcho: "127.0.0.1:9"}, 100},
		{Opts{Baseline: true, BaselineFloor: floor}, 100},
	} {
		b, err := c.o.latBaseline(8)
		if err != nil || b == nil {
			t.Fatalf("%+v: %v, %v", c.o, b, err)
		}
		if got := b.rounds(n); got != c.want {
			t.Errorf("%+v (%s): %d rounds for %d operations, want %d", c.o, b.name, got, n, c.want)
		}
	}
}
