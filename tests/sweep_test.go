package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// A test process that dies without its cleanups (go test's -timeout
// panics, a SIGKILL) leaves its cluster behind: daemons, mounts, network
// namespaces and /run/krfs-e2e-<pid>. The next run removes what belongs to
// test processes that no longer exist, before it builds its own cluster.

// staleRuns picks, from the directories in /run and the network
// namespaces, what dead test processes left: the cluster directories
// (/run/krfs-e2e-<pid>) to take down with scripts/cluster.sh, each with
// its namespace prefix, and the namespaces (ke<n>-*, kh<n>-*, named after
// pid % 100000) that no cluster directory accounts for. alive reports
// whether a process exists; self is this process's pid, never stale.
func staleRuns(runDirs, netns []string, self int, alive func(pid int) bool) (dirs map[string]string, orphans []string) {
	dirs = map[string]string{}
	covered := map[string]bool{}
	for _, d := range runDirs {
		s, ok := strings.CutPrefix(d, "krfs-e2e-")
		pid, err := strconv.Atoi(s)
		if !ok || err != nil || pid <= 0 || pid == self || alive(pid) || alive(pid%100000) {
			continue // alive(pid % 100000): that process's namespaces have the same names
		}
		prefix := fmt.Sprintf("ke%d", pid%100000)
		dirs[d] = prefix
		covered[prefix] = true
	}
	for _, ns := range netns {
		m := staleNS.FindStringSubmatch(ns)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		if n == self%100000 || alive(n) || (m[1] == "ke" && covered["ke"+m[2]]) {
			continue
		}
		orphans = append(orphans, ns)
	}
	sort.Strings(orphans)
	return dirs, orphans
}

// staleNS matches the namespaces the tests create: ke<n>-<host> (clusters,
// nonMember) and kh<n>-<tag> (privateNS).
var staleNS = regexp.MustCompile(`^(ke|kh)([0-9]+)-`)

var sweepOnce sync.Once

// sweepStale removes what dead test processes left (see staleRuns). It
// runs once per test process, before the first cluster or namespace.
func sweepStale(t *testing.T, top string) {
	sweepOnce.Do(func() {
		var runDirs []string
		if ents, err := os.ReadDir("/run"); err == nil {
			for _, e := range ents {
				if e.IsDir() {
					runDirs = append(runDirs, e.Name())
				}
			}
		}
		var netns []string
		if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
			for _, l := range strings.Split(string(out), "\n") {
				if f := strings.Fields(l); len(f) > 0 {
					netns = append(netns, f[0])
				}
			}
		}
		alive := func(pid int) bool { _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); return err == nil }
		dirs, orphans := staleRuns(runDirs, netns, os.Getpid(), alive)
		for d, prefix := range dirs {
			cmd := exec.Command(filepath.Join(top, "scripts/cluster.sh"), "down")
			cmd.Env = append(os.Environ(), "KRFS_DIR="+filepath.Join("/run", d), "KRFS_NS="+prefix)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Logf("removing a dead run's cluster %s: %v\n%s", d, err, out)
				continue
			}
			t.Logf("removed the cluster a dead test process left: /run/%s (namespaces %s-*)", d, prefix)
		}
		for _, ns := range orphans {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Logf("ip netns del %s: %v %s", ns, err, out)
				continue
			}
			t.Logf("removed namespace %s, left by a dead test process", ns)
		}
	})
}

func TestStaleRuns(t *testing.T) {
	alive := func(pid int) bool { return pid == 500 || pid == 77 }
	dirs, orphans := staleRuns(
		[]string{"krfs-e2e-26419", "krfs-e2e-500", "krfs-e2e-42", "krfs-cluster", "krfs-e2e-x", "krfs-e2e-123456", "krfs-e2e-100077"},
		[]string{"ke26419-h1", "ke26419-sw", "ke500-h1", "ke42-x", "kh31-a", "kh77-b", "ke23456-h2", "krfs-h1", "ke9-", "kmesh9-h1", "kh8"},
		42, alive)
	wantDirs := map[string]string{"krfs-e2e-26419": "ke26419", "krfs-e2e-123456": "ke23456"}
	if !reflect.DeepEqual(dirs, wantDirs) {
		t.Errorf("directories to take down: %v, want %v", dirs, wantDirs)
	}
	// ke26419-* and ke23456-* go with their directories; ke500 and kh77
	// belong to live processes, ke42 to this one; kh31 and ke9 are
	// orphans; the rest are not the tests' names.
	wantOrphans := []string{"ke9-", "kh31-a"}
	if !reflect.DeepEqual(orphans, wantOrphans) {
		t.Errorf("orphan namespaces: %v, want %v", orphans, wantOrphans)
	}
}
