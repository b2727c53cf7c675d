package nic

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/verbs/rdma"
)

// machineHasRNIC reports whether this machine has a usable RDMA port in
// this build; the tests below are about machines without one.
func machineHasRNIC(testing.TB) bool {
	_, ok := rdmaUsable(Options{GIDIndex: -1})
	return ok
}

func TestParseBackend(t *testing.T) {
	for in, want := range map[string]Backend{"": Auto, "auto": Auto, "softnic": Softnic, "rdma": RDMA} {
		if got, err := ParseBackend(in); err != nil || got != want {
			t.Errorf("ParseBackend(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseBackend("ib"); err == nil || !strings.Contains(err.Error(), "auto, softnic or rdma") {
		t.Errorf("ParseBackend(ib): %v", err)
	}
	if _, err := Open(Options{Backend: "verbs"}); err == nil {
		t.Error("Open with an unknown backend succeeded")
	}
}

func TestRDMAWithoutDeviceFailsFastAndClearly(t *testing.T) {
	if machineHasRNIC(t) {
		t.Skip("this machine has a usable RNIC; the no-device path cannot be observed here")
	}
	start := time.Now()
	o, err := Open(Options{Backend: RDMA, GIDIndex: -1})
	took := time.Since(start)
	if err == nil {
		o.Dev.Close()
		t.Fatal("--backend rdma opened a device on a machine without a usable RNIC")
	}
	if !errors.Is(err, ErrRDMAUnavailable) {
		t.Fatalf("error %v does not wrap ErrRDMAUnavailable", err)
	}
	want := "no RDMA device found"
	if !rdma.Built {
		want = "built without RDMA support"
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	if took > 2*time.Second {
		t.Fatalf("failing took %v, more than 2 s", took)
	}
	t.Logf("--backend rdma: %v (after %v)", err, took)
}

func TestAutoPicksSoftnicAndSaysWhy(t *testing.T) {
	leaktest.Check(t)
	if machineHasRNIC(t) {
		t.Skip("this machine has a usable RNIC: auto picks rdma here")
	}
	o, err := Open(Options{Backend: Auto, Listen: "127.0.0.1:0", GIDIndex: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Dev.Close()
	if o.Backend != Softnic || o.Transport != "softnic/udp" || !o.DC {
		t.Fatalf("auto opened %+v", o)
	}
	if !strings.HasPrefix(o.Reason, "auto: ") || !strings.Contains(o.Reason, "using softnic") {
		t.Fatalf("reason %q does not say why softnic was picked", o.Reason)
	}
	if !o.Dev.Addr().IsValid() || o.Dev.Addr().Port() == 0 {
		t.Fatalf("softnic device address %v", o.Dev.Addr())
	}
	t.Logf("auto: %s", o.Reason)
}

func TestSoftnicExplicit(t *testing.T) {
	leaktest.Check(t)
	o, err := Open(Options{Backend: Softnic, Listen: "127.0.0.1:0", ClusterKey: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Dev.Close()
	if o.Backend != Softnic || o.Reason != "--backend softnic" {
		t.Fatalf("opened %+v", o)
	}
	if _, err := Open(Options{Backend: Softnic, Listen: "not an address"}); err == nil {
		t.Fatal("a bad listen address was accepted")
	}
}

func TestReachable(t *testing.T) {
	if err := Reachable("softnic/udp", "softnic/udp"); err != nil {
		t.Error(err)
	}
	if err := Reachable("softnic/udp", ""); err != nil {
		t.Errorf("a peer without a recorded transport is softnic: %v", err)
	}
	err := Reachable("rdma/roce", "softnic/udp")
	if err == nil || !strings.Contains(err.Error(), "cannot reach") || !strings.Contains(err.Error(), "softnic/udp") {
		t.Errorf("rdma node and softnic peer: %v", err)
	}
	if Reachable("rdma/roce", "") == nil || Reachable("rdma/ib", "rdma/roce") == nil {
		t.Error("different transports were found reachable")
	}
}

// Listen empty: softnic opens DefaultListen (krfs mount's 127.0.0.1:4791),
// else a free port on loopback.
func TestSoftnicDefaultListen(t *testing.T) {
	leaktest.Check(t)
	o, err := Open(Options{Backend: Softnic, DefaultListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Dev.Close()
	if a := o.Dev.Addr(); a.Addr().String() != "127.0.0.1" || a.Port() == 0 {
		t.Fatalf("softnic with DefaultListen opened at %v", a)
	}
	if _, err := Open(Options{Backend: Softnic, DefaultListen: "not an address"}); err == nil {
		t.Fatal("a bad default address was accepted")
	}
}
