package tests

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStopWhileMounting sends SIGINT the moment each mount appears in
// /proc/mounts, while go-fuse's WaitMount may still be polling a file of
// the mount from the daemon itself. The daemon must unmount and exit 0.
// Before it caught signals from before the mount, a daemon killed in that
// window with the poll read but not yet answered never exited (its polling
// thread waited for good in its own FUSE request, holding /dev/fuse open):
// the hog run of `go test -race ./...` met it once, in
// TestMountBackendAutoUsesSoftnic's cleanup.
func TestStopWhileMounting(t *testing.T) {
	requireE2E(t)
	top, _ := filepath.Abs("..")
	bin := build(t, top)
	ns := privateNS(t, "stop")
	for i := range 5 {
		mnt := t.TempDir()
		logPath := mnt + ".log"
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, bin, "mount", mnt, "--shm-dir", t.TempDir(), "--mem-size", "64K")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		logf.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		deadline := time.Now().Add(hangGuard)
		for !isMounted(mnt) {
			select {
			case err := <-done:
				b, _ := os.ReadFile(logPath)
				t.Fatalf("round %d: krfs mount exited before mounting (%v): %s", i, err, b)
			default:
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("round %d: %s did not mount", i, mnt)
			}
		}
		cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-done:
			if err != nil {
				b, _ := os.ReadFile(logPath)
				t.Errorf("round %d: krfs mount after SIGINT: %v\n%s", i, err, tail(b, 20))
			}
		case <-time.After(hangGuard): // a hang guard, not a speed limit
			abortErr := abortFUSE(mnt)
			cmd.Process.Kill()
			<-done
			t.Fatalf("round %d: the daemon did not exit after SIGINT during its mount (connection aborted: %v)", i, abortErr)
		}
		if isMounted(mnt) {
			t.Errorf("round %d: %s is still mounted after the daemon exited", i, mnt)
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}
}

// abortFUSE ends the FUSE connection of the mount at mnt through fusectl
// (mounted on /sys/fs/fuse/connections if it is not), so that a daemon
// stuck in a request to itself can exit.
func abortFUSE(mnt string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	minor := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && fields[4] == mnt {
			_, minor, _ = strings.Cut(fields[2], ":")
		}
	}
	if minor == "" {
		return errors.New("not in mountinfo")
	}
	dir := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(dir, minor)); err != nil {
		if err := syscall.Mount("none", dir, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mounting fusectl: %w", err)
		}
	}
	return os.WriteFile(filepath.Join(dir, minor, "abort"), []byte("1"), 0)
}
