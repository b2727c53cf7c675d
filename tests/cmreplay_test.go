package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestConnectionRequestReplay is issue 11's capture-and-replay of a
// connection request, with --cluster-key-file on every daemon. Host A
// runs the embedded meta service (its stats show the meta server's
// connections and the NIC's CM and authentication counters); a sniffer
// on host B's interface is capturing before B's daemon starts, so the
// capture holds B's whole join: its session handshake with A, its
// connection request to A's meta service, its registration and a READ of
// A's memory. A non-member on the same bridge then sends every captured
// packet of B again, from its own address and with B's address forged.
// Nothing is accepted (no meta connection, no registration, no CM record),
// nothing that comes back carries A's memory, the drops are counted by
// cause, and both members keep working.
func TestConnectionRequestReplay(t *testing.T) {
	requireE2E(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("cm replay test cluster secret 32b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"sniff.py": sniffUDP, "replay.py": replayUDP} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := newCluster(t, 1) // for its bridge; A and B are hosts of their own
	const addrA, addrB, addrX = "10.78.0.31", "10.78.0.32", "10.78.0.203"
	nsA, nsB, nsX := c.nonMember(t, "ca", addrA), c.nonMember(t, "cb", addrB), c.nonMember(t, "cx", addrX)
	for _, ns := range []string{nsA, nsB} {
		// A daemon reaches its own address (A's embedded meta service)
		// through lo.
		if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Fatalf("lo up in %s: %v %s", ns, err, out)
		}
	}
	mntA, mntB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{mntA, mntB} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"--cluster-key-file", key, "--mem-size", "4M", "--timeout", clusterPeerTimeout}
	startNSMount(t, c.bin, nsA, mntA, append([]string{"--listen", addrA + ":4791", "--shm-dir", filepath.Join(dir, "shm-a")}, common...)...)
	c.mustSh(t, fmt.Sprintf(`printf 'secret-of-a' | dd of=%s/regions/mem bs=1 seek=4096 conv=notrunc status=none`, mntA))

	capFile := filepath.Join(dir, "capture")
	sniff := exec.Command("nsenter", "--net=/run/netns/"+nsB, "python3", filepath.Join(dir, "sniff.py"), capFile, addrB)
	var sniffErr strings.Builder
	sniff.Stdout, sniff.Stderr = &sniffErr, &sniffErr
	if err := sniff.Start(); err != nil {
		t.Fatal(err)
	}
	stopSniff := func() {
		sniff.Process.Signal(syscall.SIGTERM)
		sniff.Wait()
	}
	t.Cleanup(stopSniff)
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(capFile); err == nil {
			break // capturing
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sniffer did not start: %s", sniffErr.String())
		}
	}
	// B joins A's cluster while the sniffer watches, and reads A.
	startNSMount(t, c.bin, nsB, mntB, append([]string{"--listen", addrB + ":4791", "--meta", addrA + ":4791",
		"--shm-dir", filepath.Join(dir, "shm-b")}, common...)...)
	gidA := strings.TrimSpace(c.mustSh(t, "sed -n 's/^gid //p' "+mntA+"/stats"))
	readA := fmt.Sprintf(`dd if=%s/peers/%s/mem bs=4096 skip=1 count=1 status=none | head -c 11`, mntB, gidA)
	if out := c.mustSh(t, readA); out != "secret-of-a" {
		t.Fatalf("B's READ of A: %q", out)
	}
	stopSniff()

	capt, err := os.ReadFile(capFile)
	if err != nil {
		t.Fatalf("%v (sniffer: %s)", err, sniffErr.String())
	}
	ops := map[string]int{}
	names := map[byte]string{3: "READ_REQ", 9: "CM_REQ", 11: "CM_RTU", 13: "HS_INIT"}
	for _, l := range strings.Split(strings.TrimSpace(string(capt)), "\n") {
		f := strings.Fields(l)
		if len(f) != 5 || f[0] != addrB || f[1] != "4791" || len(f[4]) < 6 {
			continue
		}
		op, _ := strconv.ParseUint(f[4][4:6], 16, 8)
		if n, ok := names[byte(op)]; ok {
			ops[n]++
		} else {
			ops["other"]++
		}
	}
	t.Logf("captured from B's NIC: %v", ops)
	for _, op := range []string{"HS_INIT", "CM_REQ"} {
		if ops[op] == 0 {
			t.Fatalf("no %s captured (%v): the test would prove nothing", op, ops)
		}
	}

	statsA := func() map[string]int64 {
		out := map[string]int64{}
		for _, m := range regexp.MustCompile(`(?m)^(\S+) (\d+)$`).FindAllStringSubmatch(c.mustSh(t, "cat "+mntA+"/stats"), -1) {
			v, _ := strconv.ParseInt(m[2], 10, 64)
			out[m[1]] = v
		}
		return out
	}
	before := statsA()
	for _, k := range []string{"meta-server.Conns", "meta-server.Registered", "cm.Records", "node.RCAccepted",
		"nic.BadMAC", "auth.Replayed", "auth.WrongSource", "auth.StaleInit"} {
		if _, ok := before[k]; !ok {
			t.Fatalf("no %s in A's stats", k)
		}
	}
	rep, err := exec.Command("nsenter", "--net=/run/netns/"+nsX, "python3", filepath.Join(dir, "replay.py"), capFile,
		addrX, addrB, "secret-of-a").CombinedOutput()
	if err != nil {
		t.Fatalf("replay: %v %s", err, rep)
	}
	t.Logf("replay: %s", strings.TrimSpace(string(rep)))
	if m := regexp.MustCompile(`leaked (\d+)`).FindStringSubmatch(string(rep)); m == nil || m[1] != "0" {
		t.Fatalf("the non-member received A's memory: %s", rep)
	}
	// The replay script waited 2 s for answers: A has handled every
	// datagram by then (a hang guard below covers a slow machine).
	var after map[string]int64
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(100 * time.Millisecond) {
		after = statsA()
		if after["nic.BadMAC"] > before["nic.BadMAC"] || time.Now().After(deadline) {
			break
		}
	}
	d := func(k string) int64 { return after[k] - before[k] }
	t.Logf("A after the replay: BadMAC +%d, Replayed +%d, WrongSource +%d, StaleInit +%d, NoSession +%d, BadTag +%d",
		d("nic.BadMAC"), d("auth.Replayed"), d("auth.WrongSource"), d("auth.StaleInit"), d("auth.NoSession"), d("auth.BadTag"))
	for _, k := range []string{"meta-server.Conns", "meta-server.Registered", "cm.Records", "node.RCAccepted", "meta-server.Nodes"} {
		if after[k] != before[k] {
			t.Errorf("%s moved from %d to %d: a replayed request was accepted", k, before[k], after[k])
		}
	}
	if d("nic.BadMAC") == 0 {
		t.Error("A counted none of the replayed packets as rejected")
	}
	// From B's own address the captured session's counters are spent, and
	// its handshake initiation is not newer than the one A accepted.
	if d("auth.Replayed")+d("auth.StaleInit") == 0 {
		t.Error("the replay with B's address forged was not counted as replayed or stale")
	}

	// Both members still work, and B is still the only other node.
	c.mustSh(t, fmt.Sprintf(`printf 'later-of-a' | dd of=%s/regions/mem bs=1 seek=4096 conv=notrunc status=none`, mntA))
	if out := c.mustSh(t, readA); !strings.HasPrefix(out, "later-of-a") {
		t.Fatalf("B's READ of A after the replay: %q", out)
	}
	if out := strings.Fields(c.mustSh(t, "ls "+mntA+"/peers")); len(out) != 2 {
		t.Fatalf("A's peers after the replay: %v, want A and B", out)
	}
}
