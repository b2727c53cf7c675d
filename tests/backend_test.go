package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Choosing a backend (issue 14) on the real binary, on a machine with no
// RNIC (and a binary built without the rdma tag): --backend rdma fails
// at once with a message that says why, --backend auto runs softnic and
// logs why it chose it.

func TestMountBackendRDMAFailsClearly(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	ns := privateNS(t, "rdma")
	mnt := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+ns, bin, "mount", mnt,
		"--backend", "rdma", "--shm-dir", t.TempDir()).CombinedOutput()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("krfs mount --backend rdma succeeded on a machine without an RNIC:\n%s", out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	msg := string(out)
	if !strings.Contains(msg, "--backend rdma") || !(strings.Contains(msg, "without RDMA support") || strings.Contains(msg, "no RDMA device") || strings.Contains(msg, "no usable RDMA port")) {
		t.Fatalf("the error does not say why rdma is unavailable:\n%s", msg)
	}
	if n := strings.Count(strings.TrimSpace(msg), "\n"); n > 2 {
		t.Fatalf("a %d-line error for one refusal:\n%s", n+1, msg)
	}
	// Issue 14's bound: it fails within 2 s (it never waits on a network).
	if took > 2*time.Second {
		t.Fatalf("--backend rdma took %v to fail, want < 2s", took)
	}
	if isMounted(mnt) {
		t.Fatalf("%s is mounted after the failure", mnt)
	}
	t.Logf("--backend rdma failed in %v: %s", took, strings.TrimSpace(msg))
}

func TestMountBackendAutoUsesSoftnic(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	ns := privateNS(t, "auto")
	mnt := t.TempDir()
	d := startNSMount(t, bin, ns, mnt, "--backend", "auto", "--shm-dir", t.TempDir(), "--mem-size", "64K")
	b, err := os.ReadFile(d.log)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	if !strings.Contains(log, "backend=softnic") || !strings.Contains(log, "auto: ") || !strings.Contains(log, "using softnic") {
		t.Fatalf("the log does not say that auto chose softnic and why:\n%s", log)
	}
	// And the node works on it: the default region is readable.
	ents, err := os.ReadDir(filepath.Join(mnt, "peers"))
	if err != nil || len(ents) != 1 {
		t.Fatalf("peers: %v %v", ents, err)
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "peers", ents[0].Name(), "info")); err != nil {
		t.Fatal(err)
	}
}
