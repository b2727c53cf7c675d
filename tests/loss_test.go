package tests

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nsChaos drops pct% of the UDP packets entering namespace ns (nftables),
// until the returned function removes the rule.
func nsChaos(t *testing.T, ns string, pct int) (heal func()) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("KRFS_E2E") == "required" {
			t.Fatal("nft (Debian package nftables) is required")
		}
		t.Skip("needs nft (Debian package nftables)")
	}
	nft := func(args ...string) error {
		out, err := exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, "nft"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft %v in %s: %v %s", args, ns, err, out)
		}
		return nil
	}
	for _, args := range [][]string{
		{"add", "table", "inet", "chaos"},
		{"add", "chain", "inet", "chaos", "input", "{ type filter hook input priority 0; }"},
		{"add", "rule", "inet", "chaos", "input", "meta", "l4proto", "udp", "numgen", "random", "mod", "100", "<", fmt.Sprint(pct), "drop"},
	} {
		if err := nft(args...); err != nil {
			t.Fatal(err)
		}
	}
	done := false
	heal = func() {
		if !done {
			done = true
			if err := nft("delete", "table", "inet", "chaos"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(heal)
	return heal
}

// TestLossBoundedByTimeout: 30% of the UDP packets entering each of two
// hosts are dropped (both directions of every exchange). Host 1 reads
// 8-byte words of host 2's region and writes others with single pread and
// pwrite calls on peers/2/mem, with the default --timeout of 1 s. Issue 11
// asks that every operation end within --timeout + 1.5 s, that at least
// 90% of the reads succeed, and that nothing be wrong or lost: reads
// return the right bytes, and every acknowledged write is there once the
// loss ends (a failed one may or may not have landed).
//
// The test fails above --timeout + 4 s (a bound that two CPU hogs on a
// 2-vCPU machine cannot break through scheduling alone) and logs the
// operations over the issue's figure, and the longest one.
func TestLossBoundedByTimeout(t *testing.T) {
	// The daemons run with the product's default --timeout, which the
	// bounds below are about (test clusters default to a longer one, see
	// clusterPeerTimeout; at 10 s every lost packet cost a 312 ms ACK
	// timeout and the bounds measured the wrong configuration).
	t.Setenv("KRFS_MOUNT_FLAGS", strings.TrimSpace(os.Getenv("KRFS_MOUNT_FLAGS")+" --timeout 1s"))
	c := newCluster(t, 2)
	h1, h2 := c.mnt(1), c.mnt(2)
	ns := fmt.Sprintf("ke%d", os.Getpid()%100000)
	const timeout = time.Second // krfs mount's default --timeout
	const issueBound = timeout + 1500*time.Millisecond
	const hardBound = timeout + 4*time.Second

	// A known pattern in host 2's region, written locally.
	const words = 4096 // 32 KiB of pattern
	pattern := func(i int) uint64 { return uint64(i)*0x9e3779b97f4a7c15 | 1 }
	pat := make([]byte, 8*words)
	for i := range words {
		binary.LittleEndian.PutUint64(pat[8*i:], pattern(i))
	}
	local, err := os.OpenFile(filepath.Join(h2, "regions/mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	const wbase = 8 * words
	const reads, writes = 1000, 100
	if _, err := local.WriteAt(pat, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := local.WriteAt(make([]byte, 8*writes), wbase); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(h1, "peers/2/mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	got := make([]byte, 8)
	if n, err := syscall.Pread(fd, got, 0); n != 8 || err != nil || binary.LittleEndian.Uint64(got) != pattern(0) {
		t.Fatalf("pread before the loss: %d %v", n, err)
	}

	heal1 := nsChaos(t, ns+"-h1", 30)
	heal2 := nsChaos(t, ns+"-h2", 30)
	var maxD time.Duration
	var durs []time.Duration
	over := 0
	timed := func(what string, f func() error) error {
		t0 := time.Now()
		err := f()
		d := time.Since(t0)
		maxD = max(maxD, d)
		durs = append(durs, d)
		if d > issueBound {
			over++
			t.Logf("%s took %v (over the issue's --timeout + 1.5 s): %v", what, d, err)
		}
		if d > hardBound {
			t.Errorf("%s took %v with --timeout %v", what, d, timeout)
		}
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	okReads, errs := 0, map[string]int{}
	for i := range reads {
		w := rng.IntN(words)
		clear(got)
		err := timed(fmt.Sprintf("pread %d", i), func() error {
			n, err := syscall.Pread(fd, got, int64(8*w))
			if err == nil && n != 8 {
				err = fmt.Errorf("short read: %d bytes", n)
			}
			return err
		})
		if err != nil {
			errs[err.Error()]++
			continue
		}
		okReads++
		if g := binary.LittleEndian.Uint64(got); g != pattern(w) {
			t.Fatalf("pread %d of word %d returned %#x, want %#x", i, w, g, pattern(w))
		}
	}
	acked := make([]bool, writes)
	for i := range writes {
		src := make([]byte, 8)
		binary.LittleEndian.PutUint64(src, uint64(i)+1000)
		err := timed(fmt.Sprintf("pwrite %d", i), func() error {
			n, err := syscall.Pwrite(fd, src, int64(wbase+8*i))
			if err == nil && n != 8 {
				err = fmt.Errorf("short write: %d bytes", n)
			}
			return err
		})
		acked[i] = err == nil
		if err != nil && !errors.Is(err, syscall.EHOSTDOWN) && !errors.Is(err, syscall.ETIMEDOUT) && !errors.Is(err, syscall.EIO) {
			t.Errorf("pwrite %d: unexpected error %v", i, err)
		}
	}
	heal1()
	heal2()

	frac := float64(okReads) / reads
	slices.Sort(durs)
	t.Logf("30%% loss into both hosts, --timeout %v: %d/%d 8-byte preads succeeded (%.1f%%), errors %v; operations p50 %v, p90 %v, p99 %v, longest %v; %d over the issue's bound of %v",
		timeout, okReads, reads, 100*frac, errs, durs[len(durs)/2], durs[len(durs)*9/10], durs[len(durs)*99/100], maxD, over, issueBound)
	if frac < 0.90 {
		t.Errorf("only %.1f%% of 8-byte reads succeeded under 30%% loss", 100*frac)
	}
	// Nothing wrong or lost: read back on host 2, locally.
	back := make([]byte, 8*writes)
	if _, err := local.ReadAt(back, wbase); err != nil {
		t.Fatal(err)
	}
	okWrites := 0
	for i := range writes {
		g := binary.LittleEndian.Uint64(back[8*i:])
		switch {
		case acked[i] && g != uint64(i)+1000:
			t.Errorf("acknowledged pwrite %d lost: word is %d", i, g)
		case !acked[i] && g != 0 && g != uint64(i)+1000:
			t.Errorf("failed pwrite %d left %d", i, g)
		}
		if acked[i] {
			okWrites++
		}
	}
	all := make([]byte, 8*words)
	if _, err := local.ReadAt(all, 0); err != nil {
		t.Fatal(err)
	}
	for i := range words {
		if g := binary.LittleEndian.Uint64(all[8*i:]); g != pattern(i) {
			t.Fatalf("word %d of the pattern changed to %#x", i, g)
		}
	}
	// And the path works again at once.
	if n, err := syscall.Pread(fd, got, 0); n != 8 || err != nil {
		t.Fatalf("pread after the loss: %d %v", n, err)
	}
	t.Logf("pwrites acknowledged %d/%d, all present afterwards", okWrites, writes)
	if b, err := os.ReadFile(filepath.Join(h1, "stats")); err == nil {
		m := regexp.MustCompile(`node\.(LossRetries|OpTimeouts|PeersDown|PeersUp|QPErrors) (\d+)`).FindAllStringSubmatch(string(b), -1)
		t.Logf("host 1's qpcore counters: %v", m)
	}
}
