package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// checkMountpoint refuses a mountpoint that is already mounted and
// cleans up a stale FUSE mount left by a crashed daemon ("transport
// endpoint is not connected").
func checkMountpoint(dir string) (cleaned bool, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	mounted, fstype, err := mountedAt(abs)
	if err != nil {
		return false, err
	}
	if mounted {
		_, serr := os.Stat(abs)
		if errors.Is(serr, syscall.ENOTCONN) || errors.Is(serr, syscall.ECONNABORTED) {
			if err := unix.Unmount(abs, unix.MNT_DETACH); err != nil {
				return false, fmt.Errorf("%s: stale mount left by a crash, and unmounting it failed: %w", abs, err)
			}
			cleaned = true
		} else {
			return false, fmt.Errorf("%s is already mounted (%s); unmount it first", abs, fstype)
		}
	}
	st, err := os.Stat(abs)
	if err != nil {
		return cleaned, fmt.Errorf("mountpoint: %w", err)
	}
	if !st.IsDir() {
		return cleaned, fmt.Errorf("mountpoint %s is not a directory", abs)
	}
	return cleaned, nil
}

// mountedAt reports whether something is mounted at the absolute path dir,
// from /proc/self/mountinfo.
func mountedAt(dir string) (bool, string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		if unescapeMount(fields[4]) != dir {
			continue
		}
		fstype := ""
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) {
				fstype = fields[i+1]
			}
		}
		return true, fstype, nil
	}
	return false, "", sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// checkFUSE explains clearly why FUSE cannot be used, if it cannot.
func checkFUSE() error {
	if os.Geteuid() != 0 {
		return errors.New("krfs mount must run as root (it mounts FUSE directly and pins memory)")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("FUSE is unavailable: %w (is the fuse module loaded and /dev/fuse present?)", err)
	}
	f.Close()
	return nil
}

// mountHelperArgs turns mount(8) helper arguments (SOURCE DIR -o opts)
// into `krfs mount` arguments; fstab-only options are dropped.
func mountHelperArgs(args []string) []string {
	var pos []string
	var opts []string
	for i := 0; i < len(args); i++ {
		if args[i] == "-o" && i+1 < len(args) {
			opts = append(opts, strings.Split(args[i+1], ",")...)
			i++
			continue
		}
		if strings.HasPrefix(args[i], "-") {
			continue // -n, -s, -f, -v from mount(8)
		}
		pos = append(pos, args[i])
	}
	var out []string
	if len(pos) >= 2 {
		out = append(out, pos[1])
	} else if len(pos) == 1 {
		out = append(out, pos[0])
	}
	for _, o := range opts {
		k, v, hasV := strings.Cut(o, "=")
		switch {
		case k == "_netdev" || k == "nofail" || k == "noauto" || k == "auto" || k == "defaults" ||
			k == "rw" || k == "user" || k == "nouser" || strings.HasPrefix(k, "x-systemd") || strings.HasPrefix(k, "comment"):
			continue
		case k == "allow_other":
			out = append(out, "--allow-other")
		case k == "default_permissions":
			out = append(out, "--default-permissions")
		case hasV:
			out = append(out, "--"+strings.ReplaceAll(k, "_", "-")+"="+v)
		default:
			out = append(out, "--"+strings.ReplaceAll(k, "_", "-"))
		}
	}
	return out
}
