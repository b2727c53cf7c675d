package tests

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// TestRestartedPeerRegionFirstRead: host 2 exports a region r besides
// mem; host 1 reads both; host 2 restarts (the same gid and region store,
// after a kill -9, then after a clean stop). 8 threads on host 1 then
// open and pread r, 21 times each, and every read succeeds: the
// stale-region rule (one re-lookup, one retry) holds for every region,
// not only mem. After a kill -9 the restart script finds the crashed
// daemon's mount still there and returns while the new daemon is
// starting, so the readers also meet a peer that has registered its new
// incarnation but is not mounted yet: it must already export its
// regions then (with --timeout 1s this failed about every other run,
// every reader ENOENT, when a node registered before exporting them).
func TestRestartedPeerRegionFirstRead(t *testing.T) {
	// The product's default timeout (the cluster's 10 s makes the
	// window below rarer).
	t.Setenv("KRFS_MOUNT_FLAGS", strings.TrimSpace(os.Getenv("KRFS_MOUNT_FLAGS")+" --timeout 1s"))
	c := newCluster(t, 2)
	h1, h2 := c.mnt(1), c.mnt(2)
	c.mustSh(t, "printf 'region r' > "+h2+"/regions/r")
	c.mustSh(t, "printf 'region m' | dd of="+h2+"/regions/mem bs=1 seek=100 conv=notrunc status=none")
	read := func(rel string, skip int) (string, error) {
		return c.sh(hangGuard, fmt.Sprintf("dd if=%s/peers/2/%s bs=1 skip=%d count=8 status=none", h1, rel, skip))
	}
	check := func(t *testing.T, what string) {
		t.Helper()
		if out, err := read("mr/r", 0); err != nil || out != "region r" {
			t.Fatalf("%s: peers/2/mr/r on host 1: %q %v", what, out, err)
		}
		if out, err := read("mem", 100); err != nil || out != "region m" {
			t.Fatalf("%s: peers/2/mem on host 1: %q %v", what, out, err)
		}
	}
	check(t, "before any restart")
	for _, how := range []string{"kill -9", "SIGTERM"} {
		t.Run(how, func(t *testing.T) {
			check(t, "warm")
			if how == "kill -9" {
				pid := c.pid(t, 2)
				c.mustSh(t, fmt.Sprintf("kill -9 %d; while kill -0 %d 2>/dev/null; do sleep 0.01; done", pid, pid))
			}
			if out, err := c.script("restart", "2"); err != nil {
				t.Fatalf("restart: %v %s", err, out)
			}
			// 8 threads, each: its first open+pread of r after the
			// restart, then 20 more.
			var wg sync.WaitGroup
			errs := make([]string, 8)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, err := c.sh(hangGuard, fmt.Sprintf(
						`for i in $(seq 21); do dd if=%s/peers/2/mr/r bs=8 count=1 status=none || exit 1; echo; done`, h1))
					if err != nil || strings.Count(out, "region r\n") != 21 {
						errs[i] = fmt.Sprintf("%v: %q", err, out)
					}
				}()
			}
			wg.Wait()
			for i, e := range errs {
				if e != "" {
					t.Errorf("reader %d after the restart: %s", i, e)
				}
			}
			check(t, "after the restart")
		})
	}
}
