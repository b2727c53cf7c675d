// Package vethpair builds two network namespaces joined by a veth pair, for
// tests that need a real IP path with an Ethernet MTU (loopback's is
// 65536). Sockets belong to the namespace they are created in, so a test
// opens each side's socket inside Do and then uses it from any goroutine.
//
// It needs root; without it New skips the test, unless KRFS_E2E=required,
// which turns the skip into a failure.
package vethpair

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Pair is two namespaces, A and B, with addresses AddrA and AddrB on a veth
// of the given MTU.
type Pair struct {
	Names        [2]string
	AddrA, AddrB netip.Addr
	fds          [2]int
}

var seq atomic.Int32

// New creates the pair and removes it in t.Cleanup. Names carry the
// process id so that concurrent test processes never collide.
func New(t testing.TB, mtu int) *Pair {
	t.Helper()
	if os.Geteuid() != 0 {
		skip(t, "needs root for network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skip(t, "needs the ip command")
	}
	n := seq.Add(1)
	p := &Pair{
		Names: [2]string{fmt.Sprintf("kvp%d-%da", os.Getpid(), n), fmt.Sprintf("kvp%d-%db", os.Getpid(), n)},
		AddrA: netip.MustParseAddr("10.251.0.1"),
		AddrB: netip.MustParseAddr("10.251.0.2"),
		fds:   [2]int{-1, -1},
	}
	t.Cleanup(p.close)
	va, vb := fmt.Sprintf("kvp%d-%d", os.Getpid()%100000, n), fmt.Sprintf("kvq%d-%d", os.Getpid()%100000, n)
	cmds := [][]string{
		{"netns", "add", p.Names[0]},
		{"netns", "add", p.Names[1]},
		{"link", "add", va, "mtu", strconv.Itoa(mtu), "netns", p.Names[0], "type", "veth", "peer", "name", vb, "mtu", strconv.Itoa(mtu), "netns", p.Names[1]},
		{"-n", p.Names[0], "addr", "add", p.AddrA.String() + "/24", "dev", va},
		{"-n", p.Names[1], "addr", "add", p.AddrB.String() + "/24", "dev", vb},
		{"-n", p.Names[0], "link", "set", va, "up"},
		{"-n", p.Names[1], "link", "set", vb, "up"},
		{"-n", p.Names[0], "link", "set", "lo", "up"},
		{"-n", p.Names[1], "link", "set", "lo", "up"},
	}
	for _, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			if c[0] == "netns" && c[1] == "add" && len(p.Names) > 0 && os.Getenv("KRFS_E2E") != "required" {
				t.Skipf("cannot create a network namespace: %v: %s", err, out)
			}
			t.Fatalf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	for i, name := range p.Names {
		fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open namespace %s: %v", name, err)
		}
		p.fds[i] = fd
	}
	return p
}

func skip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("KRFS_E2E") == "required" {
		t.Fatalf("KRFS_E2E=required but the test %s", why)
	}
	t.Skip(why)
}

func (p *Pair) close() {
	for i, fd := range p.fds {
		if fd >= 0 {
			unix.Close(fd)
			p.fds[i] = -1
		}
	}
	for _, name := range p.Names {
		_ = exec.Command("ip", "netns", "del", name).Run()
	}
}

// Do runs f on a thread that has entered namespace i (0 for A, 1 for B).
// Sockets f creates stay in that namespace.
func (p *Pair) Do(i int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is left in the namespace and locked: Go discards a
		// goroutine's thread that exits locked, so no other goroutine ever
		// runs in the wrong namespace.
		runtime.LockOSThread()
		if err := unix.Setns(p.fds[i], unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", p.Names[i], err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// FragCreates reads Ip FragCreates (IP fragments this host created) from
// namespace i's /proc/net/snmp.
func (p *Pair) FragCreates(i int) (uint64, error) {
	var v uint64
	err := p.Do(i, func() error {
		var err error
		v, err = FragCreates()
		return err
	})
	return v, err
}

// FragCreates reads Ip FragCreates of the calling thread's namespace.
func FragCreates() (uint64, error) {
	f, err := os.Open("/proc/thread-self/net/snmp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var names []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		for k, name := range names {
			if name == "FragCreates" && k < len(fields) {
				return strconv.ParseUint(fields[k], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no Ip FragCreates in /proc/net/snmp")
}
