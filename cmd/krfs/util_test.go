package main

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
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
	got := mountHelperArgs([]string{"krfs", "/mnt/k", "-o", "rw,_netdev,nofail,x-systemd.automount,allow_other,meta=10.0.0.1:4790,gid=3,mem_size=1G"})
	want := []string{"/mnt/k", "--allow-other", "--meta=10.0.0.1:4790", "--gid=3", "--mem-size=1G"}
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
