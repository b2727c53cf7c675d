package tests

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The command's rough edges (issue 12, item 10) on the real binary and a
// real mount: generic mount options, --meta names, atomics past the end,
// cas's exit status, help for every command.

// krfsRun runs bin in namespace ns (or on the host if ns is empty) and
// returns its combined output and exit status.
func krfsRun(t *testing.T, ns, bin string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if ns != "" {
		cmd = exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + ns, bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return string(out), code
}

func TestCLIRoughEdges(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	ns := privateNS(t, "cli")
	mnt := t.TempDir()
	// Generic mount options are accepted (and nosuid/nodev/noexec applied).
	startNSMount(t, bin, ns, mnt, "--gid", "7", "--shm-dir", t.TempDir(), "--mem-size", "4K",
		"-o", "rw,noatime,nosuid,nodev,noexec,sync,relatime,_netdev")
	if !strings.Contains(mountOptionsOf(t, mnt), "noexec") {
		t.Fatalf("noexec not applied: %s", mountOptionsOf(t, mnt))
	}
	mem := filepath.Join(mnt, "peers/7/mem")

	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		// ro is refused in one line, unknown options too.
		{[]string{"mount", t.TempDir(), "-o", "ro"}, 2, []string{"ro", "read-only"}},
		{[]string{"mount", t.TempDir(), "-o", "frobnicate"}, 2, []string{"unknown mount option", "frobnicate"}},
		// A --meta name that does not resolve says so.
		{[]string{"mount", t.TempDir(), "--listen", "127.0.0.1:4877", "--meta", "no-such-host.invalid:4791"}, 1, []string{"cannot resolve", "no-such-host.invalid"}},
		// An atomic past the end says so.
		{[]string{"atomic", "faa", mem, "4096", "1"}, 1, []string{"past the end", "4096 bytes"}},
		// cas: 0 when it swapped, 1 when it did not (old value printed).
		{[]string{"atomic", "cas", mem, "8", "0", "7"}, 0, []string{"0"}},
		{[]string{"atomic", "cas", mem, "8", "0", "9"}, 1, []string{"7", "not swapped"}},
		{[]string{"atomic", "faa", mem, "8", "-7"}, 0, []string{"7"}},
		// Help in one style for every command, exit 0.
		{[]string{"atomic", "--help"}, 0, []string{"Usage:", "krfs atomic"}},
		{[]string{"mount", "--help"}, 0, []string{"Usage:", "--backend", "stays in the foreground"}},
		{[]string{"version"}, 0, []string{"krfs "}},
	} {
		out, code := krfsRun(t, ns, bin, c.args...)
		if code != c.code {
			t.Errorf("krfs %q: exit %d, want %d\n%s", c.args, code, c.code, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("krfs %q: output lacks %q:\n%s", c.args, w, out)
			}
		}
		if c.code == 2 && strings.Count(out, "\n") > 2 {
			t.Errorf("krfs %q: a usage error of %d lines:\n%s", c.args, strings.Count(out, "\n"), out)
		}
		if strings.Contains(out, "service 1263684947") {
			t.Errorf("krfs %q: a bare CM service number:\n%s", c.args, out)
		}
	}
	// Files have a link count and a modification time.
	out, _ := krfsRun(t, "", "stat", "-c", "%h %Y", mem, filepath.Join(mnt, "peers"))
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || f[0] == "0" || len(f[1]) < 10 {
			t.Errorf("stat nlink/mtime: %q", line)
		}
	}
}

// mountOptionsOf returns the mount options of the mount at dir.
func mountOptionsOf(t *testing.T, dir string) string {
	t.Helper()
	out, _ := exec.Command("findmnt", "-n", "-o", "OPTIONS", dir).CombinedOutput()
	return string(out)
}
