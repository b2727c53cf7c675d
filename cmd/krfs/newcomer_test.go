package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Rule: every bad flag of krfs mount is a usage error (exit 2, one line
// and the --help hint), with --daemon as without: flags are checked
// before the daemon detaches, so the reason is on the terminal.
func TestMountFlagsCheckedBeforeDaemonizing(t *testing.T) {
	// A mount point that does not exist: whatever slips through the
	// checks fails before anything starts.
	mnt := filepath.Join(t.TempDir(), "absent")
	for _, c := range []struct{ flag, want string }{
		{"--timeout=1ns", "--timeout 1ns: want at least 10ms"},
		{"--timeout=0", "--timeout 0s"},
		{"--timeout=-1s", "--timeout -1s"},
		{"--dcis=-1", "--dcis -1"},
		{"--rc-cap=-5", "--rc-cap -5"},
		{"--mem-size=0", "--mem-size 0"},
		{"--backend=frob", "--backend"},
		{"--log-level=loud", "--log-level"},
		{"--encrypt", "--encrypt needs --cluster-key-file"},
		{"--fuse-ring-batch=0", "--fuse-ring-batch 0: want 1 to 8"},
		{"--fuse-ring-batch=9", "--fuse-ring-batch 9: want 1 to 8"},
	} {
		for _, daemon := range []bool{false, true} {
			args := []string{"krfs", "mount", mnt, c.flag, "--shm-dir", filepath.Join(t.TempDir(), "s")}
			if daemon {
				args = append(args, "--daemon")
			}
			var out, errb bytes.Buffer
			code := run(args, &out, &errb)
			if code != 2 || !strings.Contains(errb.String(), c.want) || strings.Count(errb.String(), "\n") != 2 {
				t.Errorf("%v: exit %d, %q; want 2 and %q", args[3:], code, errb.String(), c.want)
			}
		}
	}
}

// Rule: a daemon's log goes to /var/log/krfs/krfs-GID.log unless
// --log-file says otherwise, never to /dev/null; a daemon says it serves
// in the background.
func TestDaemonLogsSomewhere(t *testing.T) {
	old := DefaultLogDir
	DefaultLogDir = filepath.Join(t.TempDir(), "log", "krfs")
	defer func() { DefaultLogDir = old }()
	if got := daemonLogFile(&mountFlags{gid: 7}, "/mnt/k"); got != filepath.Join(DefaultLogDir, "krfs-7.log") {
		t.Fatalf("log with --gid 7: %s", got)
	}
	if got := daemonLogFile(&mountFlags{}, "/mnt/k"); got != filepath.Join(DefaultLogDir, "krfs-mnt-k.log") {
		t.Fatalf("log without a gid: %s", got)
	}
	if st, err := os.Stat(DefaultLogDir); err != nil || !st.IsDir() {
		t.Fatalf("log directory not made: %v", err)
	}
	if strings.Contains(servingMessage(true), "foreground") || !strings.Contains(servingMessage(false), "foreground") {
		t.Fatal("a daemon says it serves in the foreground")
	}
	// A usage error of the child reaches the parent as one (exit 2).
	r, w, _ := os.Pipe()
	(&readyPipe{f: w}).done(fmt.Errorf("%w: --frob: bad", errUsage))
	b, _ := io.ReadAll(r)
	if string(b) != "usage: --frob: bad\n" {
		t.Fatalf("ready pipe: %q", b)
	}
}

// Rule: shell completion knows krfs res's kinds (second argument) and
// the values of --backend.
func TestCompletionValues(t *testing.T) {
	complete := func(args ...string) string {
		var out, errb bytes.Buffer
		run(append([]string{"krfs", "__complete"}, args...), &out, &errb)
		return out.String()
	}
	if got := complete("res", "/mnt", ""); !strings.Contains(got, "qp\nmr\npeer\n") {
		t.Errorf("res kinds: %q", got)
	}
	if got := complete("res", ""); strings.Contains(got, "qp") {
		t.Errorf("res's first argument is a mount point, not a kind: %q", got)
	}
	for _, cmd := range []string{"mount", "meta"} {
		if got := complete(cmd, "--backend", ""); !strings.Contains(got, "auto\nsoftnic\nrdma\n") {
			t.Errorf("%s --backend values: %q", cmd, got)
		}
	}
}

// Rule: krfs meta's registration limits refuse negative values (exit 2).
func TestMetaLimitFlags(t *testing.T) {
	for _, flag := range []string{"--max-nodes-per-source=-1", "--register-rate=-1", "--register-burst=0"} {
		var out, errb bytes.Buffer
		if code := run([]string{"krfs", "meta", "--listen", "127.0.0.1:9", flag}, &out, &errb); code != 2 || !strings.Contains(errb.String(), strings.Split(flag, "=")[0]) {
			t.Errorf("krfs meta %s: exit %d, %q", flag, code, errb.String())
		}
	}
}
