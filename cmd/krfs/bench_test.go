package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/krfs/krfs/bench"
	"github.com/krfs/krfs/bench/baseline"
	"github.com/krfs/krfs/nic"
)

func TestBenchArgs(t *testing.T) {
	o, err := parseBenchArgs([]string{"--meta", "127.0.0.1:4791", "read_lat", "--gid", "3", "-s", "4K", "-n", "10"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Test != "read_lat" || o.Size != 4096 || o.Iters != 10 || o.GID != 3 || !o.APIMode() {
		t.Errorf("parsed %+v", o)
	}
	if o.NIC.Backend != nic.Auto || o.NIC.GIDIndex != -1 {
		t.Errorf("default NIC %+v, want auto with the default GID", o.NIC)
	}
	// API mode on an RNIC: krfs bench opens its device through nic.
	o, err = parseBenchArgs([]string{"read_lat", "--meta", "127.0.0.1:4791", "--gid", "3", "--backend", "rdma",
		"--device", "mlx5_1", "--device-port", "2", "--gid-index", "3", "--traffic-class", "104"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if n := o.NIC; n.Backend != nic.RDMA || n.Device != "mlx5_1" || n.Port != 2 || n.GIDIndex != 3 || n.TrafficClass != 104 {
		t.Errorf("--backend rdma: NIC %+v", n)
	}
	if _, err := parseBenchArgs([]string{"read_lat", "--meta", "127.0.0.1:4791", "--gid", "3", "--backend", "ib"}, io.Discard); err == nil {
		t.Error("--backend ib accepted")
	}
	o, err = parseBenchArgs([]string{"read_bw", "--path", "/mnt/k/peers/1/mem", "-a", "-t", "8"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.Sizes(); len(got) != 18 || got[0] != 8 || got[17] != 1<<20 {
		t.Errorf("sweep sizes %v", got)
	}
	if o.Iters != 5000 || o.ItersFor(1<<20) != 256 || o.ItersFor(8) != 5000 || o.Mode() != "file" {
		t.Errorf("iterations %d %d %d", o.Iters, o.ItersFor(1<<20), o.ItersFor(8))
	}
	o, _ = parseBenchArgs([]string{"read_bw", "--path", "f"}, io.Discard)
	if o.Size != 1<<20 {
		t.Errorf("read_bw default size %d", o.Size)
	}
	o, _ = parseBenchArgs([]string{"atomic_lat", "--path", "f"}, io.Discard)
	if o.Size != 8 || o.Iters != 1000 {
		t.Errorf("atomic defaults %d %d", o.Size, o.Iters)
	}
	for _, bad := range [][]string{
		{},
		{"read_lat"},                           // no mode
		{"nope", "--path", "f"},                // unknown test
		{"read_lat", "read_bw", "--path", "f"}, // two tests
		{"read_lat", "--path", "f", "--meta", "127.0.0.1:1", "--gid", "1"},
		{"read_lat", "--meta", "127.0.0.1:1"},     // no gid
		{"read_lat", "--path", "f", "--gid", "2"}, // gid in file mode
		{"meta_lookup", "--path", "f"},
		{"fullmesh", "--path", "f"},
		{"read_lat", "--path", "f", "-t", "4"},
		{"read_bw", "--path", "f", "-t", "0"},
		{"atomic_lat", "--path", "f", "-s", "16"},
		{"atomic_lat", "--path", "f", "-a"},
		{"connect", "--path", "f", "-s", "8"},
		{"read_lat", "--path", "f", "-s", "8", "-a"},
		{"read_lat", "--path", "f", "-s", "1X"},
		{"read_lat", "--path", "f", "-n", "5", "-D", "1"},
		{"read_lat", "--path", "f", "--progress", "maybe"},
		{"fuse_noop_lat", "--path", "f"},
		{"read_lat", "--path", "f", "--transport", "rc"},
		{"read_lat", "--meta", "127.0.0.1:1", "--gid", "1", "--transport", "ud"},
		{"read_bw", "--path", "f", "--baseline-echo", "127.0.0.1:7"},             // latency tests only
		{"read_lat", "--path", "f", "--baseline-echo", "localhost:7"},            // not IP:PORT
		{"read_lat", "--path", "f", "--baseline-echo", "127.0.0.1:7", "-D", "1"}, // no -D
		{"read_lat", "--path", "f", "--baseline-floor", "g", "--baseline-echo", "127.0.0.1:7"},
	} {
		if _, err := parseBenchArgs(bad, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
	var stderr bytes.Buffer
	if code := run([]string{"krfs", "bench", "read_lat"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--meta HOST:PORT --gid N") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// benchCluster is one node exporting "mem" with an embedded meta service,
// registered under an assigned gid: what `krfs mount` runs.
func benchCluster(t *testing.T) (metaAddr string, gid uint32) {
	n := testNodeSized(t, 1<<16)
	return n.Device().Addr().String(), n.Self()
}

func TestBenchAPIReadLat(t *testing.T) {
	addr, gid := benchCluster(t)
	var stdout, stderr bytes.Buffer
	// --timeout (start and each operation) is only a hang guard here.
	args := []string{"bench", "read_lat", "--meta", addr, "--gid", strconv.Itoa(int(gid)), "--timeout", "2m", "-s", "64", "-n", "300", "--json", "--baseline"}
	if code := run(append([]string{"krfs"}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var r bench.Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if len(r.Tables) != 1 || len(r.Tables[0].Rows) != 1 {
		t.Fatalf("tables %+v", r.Tables)
	}
	row := r.Tables[0].Rows[0]
	if row.Bytes != 64 || row.Iterations != 300 || row.MinUs <= 0 || row.TypicalUs < row.MinUs || row.MaxUs < row.P999Us {
		t.Errorf("row %+v", row)
	}
	if len(r.Baselines) != 1 || r.Baselines[0].Baseline <= 0 || r.Baselines[0].Ratio <= 0 {
		t.Errorf("baselines %+v", r.Baselines)
	}
	t.Logf("64 B READ p50 %.2f us, UDP ping-pong %.2f us", row.TypicalUs, r.Baselines[0].Baseline)

	// The other API tests, briefly, in table form.
	for _, a := range [][]string{
		{"write_lat", "-s", "8", "-n", "50"},
		{"atomic_lat", "-n", "50"},
		{"read_bw", "-s", "4K", "-t", "8", "-n", "200"},
		{"write_bw", "-a", "-n", "20", "-t", "2"},
		{"connect", "-n", "20"},
		{"meta_lookup", "-n", "20"},
		{"fullmesh", "-n", "5"},
		{"read_bw", "-s", "8", "-t", "4", "-n", "100", "--transport", "rc"},
	} {
		stdout.Reset()
		stderr.Reset()
		args := append([]string{"krfs", "bench", "--meta", addr, "--gid", strconv.Itoa(int(gid)), "--timeout", "2m"}, a...)
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%q: exit %d: %s", a, code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "#iterations") {
			t.Errorf("%q: no table:\n%s", a, stdout.String())
		}
		if slices.Contains(a, "rc") && !strings.Contains(stdout.String(), "transport at the end: rc") {
			t.Errorf("--transport rc did not end on RC:\n%s", stdout.String())
		}
		if a[0] == "write_bw" && !strings.Contains(stdout.String(), "131072 bytes skipped") {
			t.Errorf("sizes past the region not reported:\n%s", stdout.String())
		}
	}
}

// TestBenchChosenBaselines runs read_lat with each kind of baseline: a UDP
// echo elsewhere (--baseline-echo) and a file's pread (--baseline-floor);
// a size past the floor file has no baseline.
func TestBenchChosenBaselines(t *testing.T) {
	addr, gid := benchCluster(t)
	echo, err := baseline.StartRemoteServer(netip.MustParseAddr("127.0.0.1"), 0, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	floor := filepath.Join(t.TempDir(), "floor")
	if err := os.WriteFile(floor, make([]byte, 64), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag, value, size, name string
	}{
		{"--baseline-echo", echo.UDPAddr().String(), "8", "udp_pingpong p50 (echo " + echo.UDPAddr().String() + ")"},
		{"--baseline-floor", floor, "64", "floor pread p50"},
		{"--baseline-floor", floor, "128", ""},
	} {
		var stdout, stderr bytes.Buffer
		args := []string{"krfs", "bench", "read_lat", "--meta", addr, "--gid", strconv.Itoa(int(gid)), "--timeout", "2m", "-s", c.size, "-n", "40", "--json", c.flag, c.value}
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%s %s: exit %d: %s", c.flag, c.value, code, stderr.String())
		}
		var r bench.Report
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("%v: %s", err, stdout.String())
		}
		if len(r.Tables) != 1 || r.Tables[0].Rows[0].Iterations != 40 {
			t.Fatalf("%s: tables %+v", c.flag, r.Tables)
		}
		if c.name == "" {
			if len(r.Baselines) != 0 {
				t.Errorf("-s %s past the %s floor file: baselines %+v", c.size, "64 B", r.Baselines)
			}
			continue
		}
		if len(r.Baselines) != 1 || r.Baselines[0].Name != c.name || r.Baselines[0].Baseline <= 0 {
			t.Errorf("%s: baselines %+v, want one named %q", c.flag, r.Baselines, c.name)
		}
	}
	var stderr bytes.Buffer
	args := []string{"krfs", "bench", "read_lat", "--meta", addr, "--gid", strconv.Itoa(int(gid)), "-n", "20", "--baseline-floor", floor + ".absent"}
	if code := run(args, io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "floor.absent") {
		t.Errorf("an absent floor file: exit %d, %q", code, stderr.String())
	}
}

func TestBenchFuseNoop(t *testing.T) {
	if os.Geteuid() != 0 || checkFUSE() != nil {
		t.Skip("needs root and /dev/fuse")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"krfs", "bench", "fuse_noop_lat", "-s", "4K", "-n", "200", "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var r bench.Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || len(r.Tables) != 1 || r.Tables[0].Rows[0].Iterations != 200 || r.Tables[0].Rows[0].Bytes != 4096 {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), bench.NoopFsName()+" ") {
		t.Error("no-op filesystem still mounted")
	}
}
