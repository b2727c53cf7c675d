package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Daemon mode (`krfs mount --daemon`, and always as mount.fuse.krfs).
//
// Go cannot fork, so the parent re-executes its own binary with the same
// arguments in a new session (setsid), stdin on /dev/null and stdout and
// stderr on --log-file (default: DefaultLogDir/krfs-GID.log, see
// daemonLogFile). The child inherits the write end of
// a pipe as a file descriptor named by $KRFS_DAEMON_READY_FD and, once the
// filesystem is mounted, writes "ready" to it; if it fails first, it writes
// "error: " and its error. The parent waits for either, or for the pipe to
// close (the child died), and only then exits: 0 once the mount is up,
// non-zero with the child's error otherwise.

const (
	daemonReadyEnv = "KRFS_DAEMON_READY_FD"
	// daemonWait bounds how long the parent waits for the child: joining
	// the meta service alone may take 10 s.
	daemonWait = 60 * time.Second
)

// isMountHelper reports whether the binary runs as mount(8)'s helper.
func isMountHelper() bool {
	return filepath.Base(os.Args[0]) == "mount.fuse.krfs"
}

// readyPipe is a daemon child's end of the readiness pipe.
type readyPipe struct {
	once sync.Once
	f    *os.File
}

// daemonChild returns the readiness pipe if this process is a daemon
// child, and nil otherwise.
func daemonChild() *readyPipe {
	v := os.Getenv(daemonReadyEnv)
	if v == "" {
		return nil
	}
	os.Unsetenv(daemonReadyEnv) // not for anything this process runs
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	syscall.CloseOnExec(fd)
	return &readyPipe{f: os.NewFile(uintptr(fd), "krfs-ready")}
}

// done reports the outcome to the parent, once.
func (r *readyPipe) done(err error) {
	r.once.Do(func() {
		msg := "ready\n"
		switch {
		case errors.Is(err, errUsage):
			// Usage errors keep their exit status (2) in the parent.
			msg = "usage: " + strings.TrimPrefix(err.Error(), errUsage.Error()+": ") + "\n"
		case err != nil:
			msg = "error: " + err.Error() + "\n"
		}
		_, _ = r.f.WriteString(msg)
		_ = r.f.Close()
	})
}

// DefaultLogDir is where a daemon logs without --log-file.
var DefaultLogDir = "/var/log/krfs"

// daemonLogFile is a daemon's log without --log-file:
// DefaultLogDir/krfs-GID.log with the gid it is given or remembers (its
// store's identity), else krfs-MOUNTPOINT.log (the mountpoint's path with
// '/' as '-'); in the temporary directory if DefaultLogDir cannot be
// made (not root).
func daemonLogFile(f *mountFlags, mnt string) string {
	name := ""
	if g := knownGID(f); g != 0 {
		name = fmt.Sprintf("krfs-%d.log", g)
	} else {
		abs, err := filepath.Abs(mnt)
		if err != nil {
			abs = mnt
		}
		name = "krfs" + strings.ReplaceAll(filepath.Clean(abs), "/", "-") + ".log"
	}
	if err := os.MkdirAll(DefaultLogDir, 0o750); err == nil {
		return filepath.Join(DefaultLogDir, name)
	}
	return filepath.Join(os.TempDir(), name)
}

func openLogFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("--log-file: %w", err)
	}
	return f, nil
}

// daemonize starts `krfs mount ARGS` detached and waits until it has
// mounted (nil) or failed (its error).
func daemonize(args []string, f *mountFlags, mnt string, stdout io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--daemon: finding this binary: %w", err)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer devnull.Close()
	logFile := f.logFile
	if logFile == "" {
		logFile = daemonLogFile(f, mnt)
	}
	lf, err := openLogFile(logFile)
	if err != nil {
		return err
	}
	defer lf.Close()
	out := lf
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()

	cmd := exec.Command(exe, append([]string{"mount"}, args...)...)
	cmd.Args[0] = "krfs"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, out, out
	cmd.ExtraFiles = []*os.File{w} // fd 3 in the child
	cmd.Env = append(os.Environ(), daemonReadyEnv+"=3")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("--daemon: starting the daemon: %w", err)
	}
	w.Close()

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	got := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(r, 64<<10))
		got <- string(b)
	}()
	select {
	case msg := <-got:
		msg = strings.TrimSpace(msg)
		switch {
		case msg == "ready":
			if !isMountHelper() { // mount(8) helpers are silent on success
				fmt.Fprintf(stdout, "krfs: mounted, daemon pid %d, log %s\n", cmd.Process.Pid, logFile)
			}
			return nil
		case strings.HasPrefix(msg, "error: "):
			<-exited
			return fmt.Errorf("%s (log: %s)", strings.TrimPrefix(msg, "error: "), logFile)
		case strings.HasPrefix(msg, "usage: "):
			<-exited
			return fmt.Errorf("%w: %s", errUsage, strings.TrimPrefix(msg, "usage: "))
		}
		// The pipe closed without a word: the child died.
		werr := <-exited
		return fmt.Errorf("the daemon exited before mounting (%v); see %s", werr, logFile)
	case <-time.After(daemonWait):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("the daemon did not mount within %v; killed it", daemonWait)
	}
}
