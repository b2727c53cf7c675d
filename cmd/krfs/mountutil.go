package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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

// mountHelperArgs turns mount(8) helper arguments (SOURCE DIR [-o opts]
// [-n -s -f -v]) into `krfs mount DIR -o opts`; the options are mapped by
// applyOptions.
func mountHelperArgs(args []string) []string {
	var pos, out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "-o" && i+1 < len(args) {
			out = append(out, "-o", args[i+1])
			i++
			continue
		}
		if strings.HasPrefix(args[i], "-") {
			continue // -n, -s, -f, -v from mount(8)
		}
		pos = append(pos, args[i])
	}
	if len(pos) > 0 {
		out = append([]string{pos[len(pos)-1]}, out...)
	}
	return out
}

// fstabOnly reports whether a mount option is for mount(8), fstab or
// systemd rather than for the filesystem.
func fstabOnly(k string) bool {
	switch k {
	case "_netdev", "nofail", "noauto", "auto", "defaults", "user", "nouser", "users", "owner", "group":
		return true
	}
	return strings.HasPrefix(k, "x-") || strings.HasPrefix(k, "comment")
}

// resolveMeta parses --meta, HOST:PORT[,HOST:PORT...], resolving host
// names; a name that does not resolve is a clear error.
func resolveMeta(s string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if ap, err := netip.ParseAddrPort(f); err == nil {
			out = append(out, ap)
			continue
		}
		host, port, err := net.SplitHostPort(f)
		pn, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil || host == "" {
			return nil, fmt.Errorf("%w: --meta %q: want HOST:PORT[,HOST:PORT...] (HOST a name or an IP address)", errUsage, f)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		cancel()
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("--meta %s: cannot resolve %q: %v", f, host, err)
		}
		ip := ips[0]
		for _, a := range ips { // prefer IPv4, as softnic listens on one address
			if a.Unmap().Is4() {
				ip = a
				break
			}
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(pn)))
	}
	return out, nil
}

// routeSource is the local address the kernel would send from to reach
// dst (a connected UDP socket sends nothing).
func routeSource(dst netip.AddrPort) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to the meta service %v: %w", dst, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}
