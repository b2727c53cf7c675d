package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The README's shell examples, run verbatim (issue 12): README.md marks
// each block with an HTML comment `<!-- readme-test: NAME -->` right
// before its ```sh fence; readmeBlock finds it. Each block runs under
// bash -eu in a private mount namespace (unshare -m) so that /mnt/krfs,
// /dev/shm and /run/krfs-cluster are the test's own, and in a network
// namespace of its own (single node) or with a pid-based namespace prefix
// (cluster), so that nothing collides with another run or a real node.

// readmeBlock returns the shell block of README.md marked NAME.
func readmeBlock(t *testing.T, top, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(top, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- readme-test: " + regexp.QuoteMeta(name) + " -->\\s*```sh\\n(.*?)```")
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("README.md has no block marked <!-- readme-test: %s --> followed by ```sh", name)
	}
	return string(m[1])
}

// runReadme runs script (prologue + block) in a private mount namespace
// from the repository top with bin's directory first on PATH.
func runReadme(t *testing.T, top, bin, prologue, block string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script := "set -eu\n" + prologue + "\n" + block
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "bash", "-c", script)
	cmd.Dir = top
	cmd.Env = append(os.Environ(), append(env, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "KRFS_BIN="+bin)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("README block failed: %v\n--- script:\n%s\n--- output:\n%s", err, script, out)
	}
	return string(out)
}

// wantLines checks that out holds each of want as a whole line (or the
// start of one, up to a space), in order.
func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	i := 0
	for _, w := range want {
		for i < len(lines) && strings.TrimSpace(lines[i]) != w && !strings.HasPrefix(lines[i], w+" ") {
			i++
		}
		if i == len(lines) {
			t.Fatalf("output lacks line %q (in order %q):\n%s", w, want, out)
		}
		i++
	}
}

func TestReadmeSingleNode(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	block := readmeBlock(t, top, "single-node")
	// The prologue gives the block a private loopback (port 4791 is the
	// default) and private /dev/shm and /mnt; make build is replaced by
	// the test's binary (already on PATH), everything else is verbatim.
	block = strings.Replace(block, "make build && export PATH=$PWD/bin:$PATH", "true # make build: the test's binary is on PATH", 1)
	// The network namespace is made outside the private mount namespace
	// (privateNS deletes it at cleanup; inside, the deletion would not
	// reach the host's /run/netns).
	ns := privateNS(t, "readme")
	prologue := `
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /mnt
trap 'umount /mnt/krfs 2>/dev/null || true' EXIT`
	// Run the block itself inside the network namespace (nsenter --net
	// keeps the mount namespace, so the mount stays visible to it), twice:
	// the region memory of the first run is still there for the second
	// (issue 31), whose output must be the same.
	run := "\nnsenter --net=/run/netns/" + ns + " bash -eu <<'README'\n" + block + "README\n"
	out := runReadme(t, top, bin, "", prologue+run+"echo '--- again'"+run)
	t.Logf("README single-node output:\n%s", out)
	once := []string{"krfs: mounted, daemon pid", "hello", "0", "1", "9", "not swapped (exit 1)", "hi"}
	wantLines(t, out, append(append(once, "--- again"), once...)...)
}

func TestReadmeCluster(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	block := readmeBlock(t, top, "cluster")
	ns := fmt.Sprintf("kr%d", os.Getpid()%100000)
	// A private /run: the cluster's state, mounts and netns names are the
	// test's own (cluster.sh down removes /run/krfs-cluster itself).
	prologue := "mount -t tmpfs tmpfs /run\n" +
		"trap 'scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT"
	out := runReadme(t, top, bin, prologue, block, "KRFS_NS="+ns, "KRFS_NET=10.79.0", "KRFS_MEM=1M")
	t.Logf("README cluster output:\n%s", out)
	wantLines(t, out, "1", "2", "3", "from-host-2", "0", "5", "ping")
}
