package main

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "64K": 64 << 10, "16M": 16 << 20, "1G": 1 << 30, "2GiB": 2 << 30, "1t": 1 << 40, "0": 0} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "M", "-1", "1X", "2T", "1.5G"} {
		if _, err := parseSize(bad); !errors.Is(err, errUsage) {
			t.Errorf("parseSize(%q): %v, want a usage error", bad, err)
		}
	}
}

func TestMountHelperArgs(t *testing.T) {
	got := mountHelperArgs([]string{"krfs", "/mnt/k", "-o", "rw,_netdev,nofail,x-systemd.automount,allow_other,meta=10.0.0.1:4790,gid=3,mem_size=1G", "-n"})
	want := []string{"/mnt/k", "-o", "rw,_netdev,nofail,x-systemd.automount,allow_other,meta=10.0.0.1:4790,gid=3,mem_size=1G"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/mnt/with\040space`); got != "/mnt/with space" {
		t.Fatalf("got %q", got)
	}
}

func TestUsageErrors(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"krfs"}, &out, &errb); code != 2 {
		t.Fatalf("no command: exit %d", code)
	}
	if code := run([]string{"krfs", "frobnicate"}, &out, &errb); code != 2 || !bytes.Contains(errb.Bytes(), []byte("unknown command")) {
		t.Fatalf("unknown command: exit %d, %s", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"krfs", "atomic", "faa", "/nonexistent", "3", "1"}, &out, &errb); code != 2 || !bytes.Contains(errb.Bytes(), []byte("aligned")) {
		t.Fatalf("misaligned atomic: exit %d, %s", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"krfs", "atomic", "faa", "/nonexistent", "8", "1"}, &out, &errb); code != 1 || !bytes.Contains(errb.Bytes(), []byte("no such file")) {
		t.Fatalf("missing file: exit %d, %s", code, errb.String())
	}
}

// TestMountOptions: -o maps krfs options onto flags, applies or accepts
// generic ones, and refuses ro and unknown options in one line each.
func TestMountOptions(t *testing.T) {
	parse := func(opts string) (*mountFlags, error) {
		cmd := &cobra.Command{Use: "mount"}
		f := &mountFlags{}
		f.register(cmd.Flags())
		if err := cmd.Flags().Parse([]string{"/mnt", "-o", opts}); err != nil {
			t.Fatal(err)
		}
		return f, applyOptions(cmd, f)
	}
	f, err := parse("rw,noatime,nosuid,nodev,noexec,sync,relatime,_netdev,allow_other,gid=3,meta=10.0.0.1:4790,mem_size=1G")
	if err != nil {
		t.Fatal(err)
	}
	if !f.allowOther || f.gid != 3 || f.meta != "10.0.0.1:4790" || f.memSize != "1G" ||
		!reflect.DeepEqual(f.fuseOpts, []string{"nosuid", "nodev", "noexec"}) {
		t.Fatalf("got %+v", f)
	}
	for opt, want := range map[string]string{"ro": "read-only", "frob": "unknown mount option", "gid": "needs a value", "gid=x": "gid=x"} {
		if _, err := parse(opt); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), want) || strings.Count(err.Error(), "\n") != 0 {
			t.Errorf("-o %s: %v, want one line with %q", opt, err, want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"krfs", "mount", t.TempDir(), "-o", "ro"}, &out, &errb); code != 2 || strings.Count(errb.String(), "\n") != 2 {
		t.Fatalf("krfs mount -o ro: exit %d, %q", code, errb.String())
	}
}

// TestHelpEverywhere: every command answers --help with exit 0 in one style.
func TestHelpEverywhere(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"atomic", "--help"}, {"atomic", "cas", "--help"}, {"mount", "--help"},
		{"bench", "--help"}, {"res", "--help"}, {"meta", "--help"}, {"devices", "--help"}, {"version", "--help"}} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"krfs"}, args...), &out, &errb); code != 0 || !strings.Contains(out.String(), "Usage:") {
			t.Errorf("krfs %v: exit %d, %q %q", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"krfs", "completion", "bash"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "__start_krfs") {
		t.Errorf("completion bash: exit %d %q", code, errb.String())
	}
	dir := t.TempDir()
	if code := run([]string{"krfs", "man", dir}, &out, &errb); code != 0 {
		t.Fatalf("man: exit %d %q", code, errb.String())
	}
	if b, err := os.ReadFile(filepath.Join(dir, "krfs-mount.8")); err != nil || !bytes.Contains(b, []byte("--backend")) {
		t.Fatalf("krfs-mount.8: %v", err)
	}
	out.Reset()
	if code := run([]string{"krfs", "version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "krfs ") {
		t.Fatalf("version: %d %q", code, out.String())
	}
}

// TestResolveMeta: --meta takes IPs and names; a name that does not
// resolve is a clear error, a malformed entry a usage error.
func TestResolveMeta(t *testing.T) {
	got, err := resolveMeta("10.0.0.1:4791, localhost:4790")
	if err != nil || len(got) != 2 || got[0].String() != "10.0.0.1:4791" || got[1].Port() != 4790 || !got[1].Addr().IsLoopback() {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := resolveMeta("no-such-host.invalid:4791"); err == nil || !strings.Contains(err.Error(), "cannot resolve") {
		t.Fatalf("unresolvable name: %v", err)
	}
	for _, bad := range []string{"host", "host:port", ":4791", "10.0.0.1:99999"} {
		if _, err := resolveMeta(bad); !errors.Is(err, errUsage) {
			t.Errorf("resolveMeta(%q): %v, want a usage error", bad, err)
		}
	}
}

// TestBenchListenFollowsRoute: API mode's --listen defaults to the
// address the route to the meta service leaves from, not 127.0.0.1.
func TestBenchListenFollowsRoute(t *testing.T) {
	o, err := parseBenchArgs([]string{"read_lat", "--meta", "127.0.0.2:4791", "--gid", "2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	src, err := routeSource(netip.MustParseAddrPort("127.0.0.2:4791"))
	if err != nil || o.Listen != netip.AddrPortFrom(src, 0).String() {
		t.Fatalf("listen %q, route source %v %v", o.Listen, src, err)
	}
	o, err = parseBenchArgs([]string{"read_lat", "--meta", "127.0.0.2:4791", "--gid", "2", "--listen", "127.0.0.1:5000"}, io.Discard)
	if err != nil || o.Listen != "127.0.0.1:5000" {
		t.Fatalf("an explicit --listen: %q %v", o.Listen, err)
	}
}
