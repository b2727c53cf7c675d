package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/bench/baseline"
)

// TestBenchConnectColdPair: connect with an echo for the meta service's
// host and one for the peer's reports the cold pair (baseline.ColdPair)
// as the baseline of cold+read8, one pair per cold connect; an echo
// missing is a usage error, not a silent fallback to another baseline.
func TestBenchConnectColdPair(t *testing.T) {
	addr, gid := benchCluster(t)
	lo := netip.MustParseAddr("127.0.0.1")
	var echoes []string
	for range 2 {
		s, err := baseline.StartRemoteServer(lo, 0, 0, 8)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		echoes = append(echoes, s.UDPAddr().String())
	}
	common := []string{"krfs", "bench", "connect", "--meta", addr, "--gid", strconv.Itoa(int(gid)), "--timeout", "2m", "-n", "30"}
	var stdout, stderr bytes.Buffer
	args := append(common, "--json", "--baseline-meta-echo", echoes[0], "--baseline-echo", echoes[1])
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var r bench.Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(r.Baselines) != 1 || !strings.Contains(r.Baselines[0].Name, "udp meta+peer") ||
		!strings.HasSuffix(r.Baselines[0].Name, "vs cold+read8") || r.Baselines[0].Baseline <= 0 || r.Baselines[0].Ratio <= 0 {
		t.Fatalf("baselines %+v, want the cold pair against cold+read8", r.Baselines)
	}
	t.Logf("%s: krfs %.1f us, floor %.1f us, %.2fx", r.Baselines[0].Name, r.Baselines[0].Krfs, r.Baselines[0].Baseline, r.Baselines[0].Ratio)

	for _, bad := range [][]string{
		{"--baseline-echo", echoes[1]},      // no meta echo
		{"--baseline-meta-echo", echoes[0]}, // no peer echo
		{"--baseline-meta-echo", "nowhere", "--baseline-echo", echoes[1]},
	} {
		stderr.Reset()
		if code := run(append(common, bad...), io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "echo") {
			t.Errorf("%q: exit %d, %q", bad, code, stderr.String())
		}
	}
	stderr.Reset()
	bad := []string{"krfs", "bench", "read_lat", "--meta", addr, "--gid", strconv.Itoa(int(gid)), "-n", "5", "--baseline-meta-echo", echoes[0]}
	if code := run(bad, io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "connect") {
		t.Errorf("read_lat --baseline-meta-echo: exit %d, %q", code, stderr.String())
	}
}
