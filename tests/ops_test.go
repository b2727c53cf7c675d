package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Operations: metrics, `krfs res`, daemon mode, the mount(8) helper and
// access control, on the real binary mounted on loopback.

// opsDir makes a directory every user may traverse (t.TempDir's are
// private to root), so that access tests fail for the reason they test.
func opsDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "krfs-ops")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func isMounted(mnt string) bool {
	b, _ := os.ReadFile("/proc/self/mounts")
	return strings.Contains(string(b), " "+mnt+" fuse")
}

// unmountDaemon unmounts mnt, which makes its detached daemon exit, and
// waits until the daemon's NIC address is free again.
func unmountDaemon(t *testing.T, mnt string) {
	t.Helper()
	if !isMounted(mnt) {
		return
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Logf("umount %s: %v %s; detaching", mnt, err, out)
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	}
}

func runCmd(t *testing.T, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func freeTCPAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestDaemonMode: `krfs mount --daemon` returns only once the filesystem is
// mounted, leaves the daemon in its own session, and reports a failure
// with the daemon's error and a non-zero status.
func TestDaemonMode(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	dir := opsDir(t)
	mnt := mkdir(t, filepath.Join(dir, "mnt"))
	logf := filepath.Join(dir, "daemon.log")
	t.Cleanup(func() { unmountDaemon(t, mnt) })

	out, err := runCmd(t, 70*time.Second, bin, "mount", mnt, "--daemon", "--listen", "127.0.0.1:4861", "--gid", "3",
		"--shm-dir", filepath.Join(dir, "shm"), "--log-file", logf)
	if err != nil {
		t.Fatalf("krfs mount --daemon: %v\n%s", err, out)
	}
	// No waiting: it must be mounted when the command returns.
	if !isMounted(mnt) {
		t.Fatalf("krfs mount --daemon returned before %s was mounted: %s", mnt, out)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "peers/3/info")); err != nil || !strings.Contains(string(b), "gid 3") {
		t.Fatalf("peers/3/info: %v %q", err, b)
	}
	m := regexp.MustCompile(`daemon pid (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no daemon pid in %q", out)
	}
	pid, _ := strconv.Atoi(m[1])
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("daemon %d: session %d, %v; want a session of its own", pid, sid, err)
	}
	if b, _ := os.ReadFile(logf); !strings.Contains(string(b), "krfs mounted") {
		t.Errorf("--log-file has no \"krfs mounted\": %q", b)
	}

	// Failures come back with the daemon's error, promptly, and nothing
	// is left mounted.
	other := mkdir(t, filepath.Join(dir, "other"))
	start := time.Now()
	out, err = runCmd(t, 70*time.Second, bin, "mount", other, "--daemon", "--listen", "127.0.0.1:4861",
		"--shm-dir", filepath.Join(dir, "shm2"))
	if err == nil || !strings.Contains(out, "in use") {
		t.Errorf("daemon on a used address: %v %q; want a failure that says \"in use\"", err, out)
	}
	// The parent hears the child's failure; it must not wait out its
	// own 60 s limit (daemonWait) to report it.
	if el := time.Since(start); el >= 60*time.Second {
		t.Errorf("the failing daemon took %v: the parent waited out its limit instead of hearing the failure", el)
	}
	if isMounted(other) {
		t.Errorf("%s mounted after a failure", other)
		unmountDaemon(t, other)
	}

	// Unmounting ends the daemon.
	unmountDaemon(t, mnt)
	deadline := time.Now().Add(hangGuard)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d still runs %v after its unmount", pid, hangGuard)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// installHelper makes /sbin/mount.fuse.krfs a symlink to bin for the
// test, restoring whatever was there.
func installHelper(t *testing.T, bin string) {
	t.Helper()
	const helper = "/sbin/mount.fuse.krfs"
	backup := ""
	if _, err := os.Lstat(helper); err == nil {
		backup = helper + fmt.Sprintf(".krfs-test-%d", os.Getpid())
		if err := os.Rename(helper, backup); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(bin, helper); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(helper)
		if backup != "" {
			os.Rename(backup, helper)
		}
	})
}

// TestMountHelper: `mount -t fuse.krfs` and an fstab line (mount -T)
// mount a node through /sbin/mount.fuse.krfs, fstab-only options ignored,
// and `make install` puts the helper in place.
func TestMountHelper(t *testing.T) {
	requireE2E(t)
	if _, err := exec.LookPath("mount"); err != nil {
		if os.Getenv("KRFS_E2E") == "required" {
			t.Fatal("mount(8) missing")
		}
		t.Skip("mount(8) missing")
	}
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	installHelper(t, bin)
	dir := opsDir(t)

	t.Run("mount -t", func(t *testing.T) {
		mnt := mkdir(t, filepath.Join(dir, "t"))
		t.Cleanup(func() { unmountDaemon(t, mnt) })
		opts := "listen=127.0.0.1:4862,gid=5,mem_size=1M,shm_dir=" + filepath.Join(dir, "shm-t") +
			",log_file=" + filepath.Join(dir, "t.log") + ",_netdev,nofail,defaults"
		out, err := runCmd(t, 70*time.Second, "mount", "-t", "fuse.krfs", "none", mnt, "-o", opts)
		if err != nil {
			b, _ := os.ReadFile(filepath.Join(dir, "t.log"))
			t.Fatalf("mount -t fuse.krfs: %v\n%s\nlog:\n%s", err, out, b)
		}
		if !isMounted(mnt) {
			t.Fatalf("mount(8) returned before %s was mounted", mnt)
		}
		b, err := os.ReadFile(filepath.Join(mnt, "peers/5/mem"))
		if err != nil || len(b) != 1<<20 {
			t.Fatalf("peers/5/mem: %v, %d bytes; want 1M (mem_size=1M)", err, len(b))
		}
	})

	t.Run("fstab", func(t *testing.T) {
		mnt := mkdir(t, filepath.Join(dir, "f"))
		t.Cleanup(func() { unmountDaemon(t, mnt) })
		fstab := filepath.Join(dir, "fstab")
		line := fmt.Sprintf("none %s fuse.krfs listen=127.0.0.1:4863,gid=6,shm_dir=%s,_netdev,nofail,noauto,x-systemd.automount,defaults 0 0\n",
			mnt, filepath.Join(dir, "shm-f"))
		if err := os.WriteFile(fstab, []byte("# test fstab\n"+line), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := runCmd(t, 70*time.Second, "mount", "-T", fstab, mnt)
		if err != nil {
			t.Fatalf("mount -T %s %s: %v\n%s", fstab, mnt, err, out)
		}
		if b, err := os.ReadFile(filepath.Join(mnt, "peers/6/info")); err != nil || !strings.Contains(string(b), "gid 6") {
			t.Fatalf("peers/6/info: %v %q", err, b)
		}
		if out, err := runCmd(t, 20*time.Second, "umount", mnt); err != nil {
			t.Fatalf("umount: %v %s", err, out)
		}
		if isMounted(mnt) {
			t.Fatal("still mounted after umount")
		}
	})

	t.Run("make install", func(t *testing.T) {
		dest := t.TempDir()
		// -o build: install the binary under test, whatever the tree.
		out, err := runCmd(t, 5*time.Minute, "make", "-C", top, "-o", "build", "install",
			"INSTALL_BIN="+bin, "DESTDIR="+dest, "PREFIX=/usr")
		if err != nil {
			t.Fatalf("make install: %v\n%s", err, out)
		}
		target, err := os.Readlink(filepath.Join(dest, "sbin/mount.fuse.krfs"))
		if err != nil || target != "/usr/bin/krfs" {
			t.Fatalf("sbin/mount.fuse.krfs -> %q, %v; want /usr/bin/krfs", target, err)
		}
		if st, err := os.Stat(filepath.Join(dest, "usr/bin/krfs")); err != nil || st.Mode()&0o111 == 0 {
			t.Fatalf("usr/bin/krfs: %v", err)
		}
		unit, err := os.ReadFile(filepath.Join(dest, "usr/lib/systemd/system/krfs@.service"))
		if err != nil || !strings.Contains(string(unit), "ExecStart=/usr/bin/krfs mount ") {
			t.Fatalf("unit: %v\n%s", err, unit)
		}
	})
}

// asNobody runs a shell command as user nobody (uid/gid 65534, no
// supplementary groups).
func asNobody(t *testing.T, script string) (string, error) {
	t.Helper()
	return runCmd(t, 20*time.Second, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c", script)
}

func requireSetpriv(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("setpriv"); err != nil {
		if os.Getenv("KRFS_E2E") == "required" {
			t.Fatal("setpriv (util-linux) missing")
		}
		t.Skip("setpriv (util-linux) missing")
	}
}

func wantDenied(t *testing.T, what, out string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("%s as nobody: %v %q; want Permission denied (EACCES)", what, err, strings.TrimSpace(out))
	}
}

// TestAccessControl: the mount is private to root by default; with
// --allow-other --default-permissions the modes and owners of
// regions/<name> decide.
func TestAccessControl(t *testing.T) {
	requireE2E(t)
	requireSetpriv(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	dir := opsDir(t)

	t.Run("private by default", func(t *testing.T) {
		mnt := mkdir(t, filepath.Join(dir, "private"))
		startMount(t, bin, mnt, "--listen", "127.0.0.1:4864", "--gid", "1", "--shm-dir", filepath.Join(dir, "shm-p"))
		out, err := asNobody(t, "ls "+mnt)
		wantDenied(t, "ls MOUNT", out, err)
		out, err = asNobody(t, "cat "+filepath.Join(mnt, "regions/mem")+" >/dev/null")
		wantDenied(t, "cat regions/mem", out, err)
		// Root can.
		if _, err := os.ReadFile(filepath.Join(mnt, "stats")); err != nil {
			t.Fatalf("root: %v", err)
		}
	})

	t.Run("allow-other", func(t *testing.T) {
		mnt := mkdir(t, filepath.Join(dir, "shared"))
		startMount(t, bin, mnt, "--listen", "127.0.0.1:4865", "--gid", "2", "--shm-dir", filepath.Join(dir, "shm-s"),
			"--allow-other", "--default-permissions")
		r := filepath.Join(mnt, "regions/r1")
		f, err := os.Create(r)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := os.Truncate(r, 4096); err != nil {
			t.Fatal(err)
		}
		w, err := os.OpenFile(r, os.O_WRONLY, 0) // no O_TRUNC: that would resize the region
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteAt([]byte("secret"), 0); err != nil {
			t.Fatal(err)
		}
		w.Close()
		read := "head -c 6 " + r
		write := "printf x | dd of=" + r + " conv=notrunc status=none"

		if err := os.Chmod(r, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := asNobody(t, read)
		wantDenied(t, "reading a 0600 region", out, err)

		if err := os.Chmod(r, 0o644); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(r); err != nil || st.Mode().Perm() != 0o644 {
			t.Fatalf("after chmod 644: %v %v", st.Mode(), err)
		}
		if out, err := asNobody(t, read); err != nil || out != "secret" {
			t.Errorf("reading a 0644 region as nobody: %v %q", err, out)
		}
		out, err = asNobody(t, write)
		wantDenied(t, "writing a 0644 region", out, err)

		// Only the owner changes the mode, only root the owner.
		if out, err := asNobody(t, "chmod 666 "+r); err == nil || !strings.Contains(out, "Operation not permitted") {
			t.Errorf("chmod of root's region as nobody: %v %q; want EPERM", err, out)
		}
		if out, err := asNobody(t, "chown 65534 "+r); err == nil {
			t.Errorf("chown as nobody succeeded: %q", out)
		}
		// Ownership is honoured too: nobody's 0600 region is nobody's.
		if err := os.Chown(r, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(r, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := asNobody(t, write+" && "+read); err != nil || out != "xecret" {
			t.Errorf("nobody on its own 0600 region: %v %q", err, out)
		}
		// Creating regions is root's (regions/ is 0755 root).
		out, err = asNobody(t, "touch "+filepath.Join(mnt, "regions/mine"))
		wantDenied(t, "creating a region", out, err)
	})
}

// TestMetricsAndRes: a mounted node serves Prometheus metrics that move
// with traffic through the filesystem, and `krfs res` lists its QPs,
// regions and peers.
func TestMetricsAndRes(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	dir := opsDir(t)
	mnt := mkdir(t, filepath.Join(dir, "m"))
	maddr := freeTCPAddr(t)
	startMount(t, bin, mnt, "--listen", "127.0.0.1:4866", "--gid", "4", "--shm-dir", filepath.Join(dir, "shm"),
		"--metrics-addr", maddr)

	scrape := func() string {
		t.Helper()
		resp, err := http.Get("http://" + maddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("scrape: %v %s", err, resp.Status)
		}
		return string(b)
	}
	value := func(page, series string) float64 {
		for _, line := range strings.Split(page, "\n") {
			if strings.HasPrefix(line, series+" ") {
				v, err := strconv.ParseFloat(strings.TrimPrefix(line, series+" "), 64)
				if err == nil {
					return v
				}
			}
		}
		return 0
	}
	before := scrape()

	// Traffic: 8 x 4 KiB writes and reads through peers/4/mem.
	f, err := os.OpenFile(filepath.Join(mnt, "peers/4/mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := 0; i < 8; i++ {
		if _, err := f.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	after := scrape()
	for _, c := range []struct {
		series string
		min    float64
	}{
		{`krfs_ops_total{op="read",transport="dc"}`, 8},
		{`krfs_ops_total{op="write",transport="dc"}`, 8},
		{`krfs_op_bytes_total{op="read",transport="dc"}`, 8 * 4096},
		{`krfs_op_duration_seconds_count{op="read"}`, 8},
		{`krfs_wrs_posted_total{transport="dc"}`, 16},
		{`krfs_nic_packets_total{direction="tx"}`, 16},
	} {
		if d := value(after, c.series) - value(before, c.series); d < c.min {
			// An op may have switched to RC; count both transports.
			alt := strings.Replace(c.series, `transport="dc"`, `transport="rc"`, 1)
			if alt == c.series || d+value(after, alt)-value(before, alt) < c.min {
				t.Errorf("%s moved by %v, want at least %v", c.series, d, c.min)
			}
		}
	}
	if v := value(after, `krfs_region_bytes{region="mem"}`); v != 16<<20 {
		t.Errorf("region mem: %v bytes", v)
	}

	res := func(args ...string) string {
		t.Helper()
		out, err := runCmd(t, 20*time.Second, bin, append([]string{"res", mnt}, args...)...)
		if err != nil {
			t.Fatalf("krfs res %v: %v %s", args, err, out)
		}
		return out
	}
	if qp := res("qp"); !regexp.MustCompile(`(?m)^link softnic/1 lqpn \d+ type DCI state RTS sq-psn \d+ `).MatchString(qp) {
		t.Errorf("krfs res qp:\n%s", qp)
	}
	if mr := res("mr"); !regexp.MustCompile(`(?m)^link softnic/1 rkey 0x[0-9a-f]+ mrlen 16777216 .* name mem `).MatchString(mr) {
		t.Errorf("krfs res mr:\n%s", mr)
	}
	if p := res("peer"); !regexp.MustCompile(`(?m)^link softnic/1 gid 4 address 127\.0\.0\.1:4866 .*transport (dc|rc).* self$`).MatchString(p) {
		t.Errorf("krfs res peer:\n%s", p)
	}
	if j := res("peer", "-j"); !strings.HasPrefix(j, `[{"gid":4,`) {
		t.Errorf("krfs res peer -j: %s", j)
	}
	if _, err := runCmd(t, 20*time.Second, bin, "res", dir, "qp"); err == nil {
		t.Error("krfs res on a directory that is not a mount succeeded")
	}
	var exitErr *exec.ExitError
	if _, err := runCmd(t, 20*time.Second, bin, "res", mnt, "bogus"); !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 {
		t.Errorf("krfs res MOUNT bogus: %v; want exit status 2", err)
	}
}

// TestSystemdNotify: run in the foreground as systemd's Type=notify
// service does, krfs sends READY=1 to $NOTIFY_SOCKET only once the
// filesystem is mounted, and SIGTERM unmounts it.
func TestSystemdNotify(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	dir := opsDir(t)
	mnt := mkdir(t, filepath.Join(dir, "n"))
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	cmd := exec.Command(bin, "mount", mnt, "--listen", "127.0.0.1:4867", "--shm-dir", filepath.Join(dir, "shm"))
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var werr error
	exited := make(chan struct{})
	go func() { werr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		unmountDaemon(t, mnt)
	})

	conn.SetReadDeadline(time.Now().Add(hangGuard))
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v\n%s", err, out.String())
	}
	if msg := string(buf[:n]); !strings.Contains(msg, "READY=1") {
		t.Fatalf("notification %q, want READY=1", msg)
	}
	if !isMounted(mnt) {
		t.Fatal("READY=1 before the mount was up")
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if werr != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", werr, out.String())
		}
	case <-time.After(hangGuard):
		t.Fatalf("still running %v after SIGTERM", hangGuard)
	}
	if isMounted(mnt) {
		t.Error("still mounted after SIGTERM")
	}
}
