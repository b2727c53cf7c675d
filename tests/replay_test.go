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

// sniffUDP runs in a member's namespace: it captures, with an AF_PACKET
// socket on eth0, every IPv4 UDP datagram that the namespace's own
// address (argv[2]) sends or receives and appends it to argv[1] as
// "src-ip src-port dst-ip dst-port hex-payload" lines. On SIGTERM it
// writes what the socket already holds before it exits: a datagram sent
// just before the test stops it is in the socket's queue (the packet tap
// runs in the sender's context) but may not have been read yet on a busy
// machine (the FETCH_ADD went missing once under two CPU-bound loops).
const sniffUDP = `
import socket, struct, sys, binascii, signal
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.bind(('eth0', 0))
s.settimeout(0.05)
stopping = []
signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
out = open(sys.argv[1], 'w', buffering=1)  # created once capturing
while True:
    try:
        f, addr = s.recvfrom(70000)
    except socket.timeout:
        if stopping:
            break  # the queue is empty
        continue
    if len(f) < 14 + 28 or f[12:14] != b'\x08\x00':
        continue
    ip = f[14:]
    if ip[9] != 17:
        continue
    ihl = (ip[0] & 15) * 4
    sport, dport, ulen = struct.unpack('!HHH', ip[ihl:ihl+6])
    out.write('%s %d %s %d %s\n' % (socket.inet_ntoa(ip[12:16]), sport, socket.inet_ntoa(ip[16:20]), dport,
                                     binascii.hexlify(ip[ihl+8:ihl+ulen]).decode()))
out.close()
`

// replayUDP runs in the non-member namespace: it sends every captured
// datagram of argv[1] again, once from its own UDP socket (argv[2]:4791)
// and once with the member's address argv[3] forged (raw socket), then
// listens 2 s and prints how many datagrams came back and whether any
// carried one of the secrets argv[4:].
const replayUDP = `
import socket, struct, sys, binascii, time
caps = [l.split() for l in open(sys.argv[1]) if l.strip()]
caps = [c[2:] for c in caps if c[0] == sys.argv[3] and c[1] == '4791']
me, forged, secrets = sys.argv[2], sys.argv[3], [a.encode() for a in sys.argv[4:]]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind((me, 4791))
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
sent = 0
for dst, port, hexp in caps:
    p = binascii.unhexlify(hexp)
    u.sendto(p, (dst, int(port)))
    udp = struct.pack('!HHHH', 4791, int(port), 8 + len(p), 0) + p
    hdr = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), sent % 65536, 0x4000, 64, 17, 0,
                      socket.inet_aton(forged), socket.inet_aton(dst))
    r.sendto(hdr + udp, (dst, 0))
    sent += 2
u.settimeout(0.2)
back, leaked, end = 0, 0, time.time() + 2
while time.time() < end:
    try:
        d, a = u.recvfrom(70000)
    except socket.timeout:
        continue
    back += 1
    if any(s in d for s in secrets):
        leaked += 1
print('sent %d back %d leaked %d' % (sent, back, leaked))
`

// TestReplayFromNonMember is issue 11's capture-and-replay with
// --cluster-key-file on every daemon: host 2's packets (READ, WRITE,
// FETCH_ADD, and whatever connection and meta traffic happens meanwhile)
// are captured on host 2's interface; after host 1 changes its memory, a
// non-member on the same bridge sends them all again from its own address
// and with host 2's address forged. Nothing executes on host 1 (the WRITE
// is not rewound, the FETCH_ADD counter does not move), nothing that
// comes back carries host 1's memory, the drops are counted, and the
// members keep working.
func TestReplayFromNonMember(t *testing.T) {
	requireE2E(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("replay test cluster secret 32 bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KRFS_MOUNT_FLAGS", strings.TrimSpace(os.Getenv("KRFS_MOUNT_FLAGS")+" --cluster-key-file "+key))
	t.Setenv("KRFS_META_FLAGS", strings.TrimSpace(os.Getenv("KRFS_META_FLAGS")+" --cluster-key-file "+key))
	c := newCluster(t, 2)
	h1, h2 := c.mnt(1), c.mnt(2)
	ns := c.prefix()
	x := c.nonMember(t, "r", "10.78.0.201")
	for name, src := range map[string]string{"sniff.py": sniffUDP, "replay.py": replayUDP} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	c.mustSh(t, fmt.Sprintf(`printf 'first-secret' | dd of=%s/regions/mem bs=1 seek=8192 conv=notrunc status=none`, h1))
	capFile := filepath.Join(dir, "capture")
	sniff := exec.Command("nsenter", "--net=/run/netns/"+ns+"-h2", "python3", filepath.Join(dir, "sniff.py"), capFile, "10.78.0.2")
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
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(capFile); err == nil {
			break // the sniffer is capturing
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sniffer did not start: %s", sniffErr.String())
		}
	}
	out := c.mustSh(t, fmt.Sprintf(`dd if=%s/peers/1/mem bs=4096 skip=2 count=1 status=none | head -c 12; echo; `+
		`printf 'written-by-2' | dd of=%s/peers/1/mem bs=1 seek=200 conv=notrunc status=none; `+
		`"$KRFS" atomic faa %s/peers/1/mem 512 1`, h2, h2, h2))
	if !strings.Contains(out, "first-secret") {
		t.Fatalf("host 2's READ of host 1: %q", out)
	}
	stopSniff()
	capt, err := os.ReadFile(capFile)
	if err != nil {
		t.Fatalf("%v (sniffer: %s)", err, sniffErr.String())
	}
	ops := map[string]int{}
	names := map[byte]string{2: "WRITE", 3: "READ_REQ", 6: "FETCH_ADD", 9: "CM_REQ", 13: "HS_INIT"}
	lines := strings.Split(strings.TrimSpace(string(capt)), "\n")
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 5 && f[0] == "10.78.0.2" && f[1] == "4791" && len(f[4]) >= 6 {
			op, _ := strconv.ParseUint(f[4][4:6], 16, 8)
			if n, ok := names[byte(op)]; ok {
				ops[n]++
			} else {
				ops["other"]++
			}
		}
	}
	t.Logf("captured %d UDP datagrams on host 2; sent by host 2's NIC: %v", len(lines), ops)
	for _, op := range []string{"WRITE", "READ_REQ", "FETCH_ADD"} {
		if ops[op] == 0 {
			t.Fatalf("no %s captured (%v): the test would prove nothing", op, ops)
		}
	}

	// Host 1 changes its memory after the capture.
	c.mustSh(t, fmt.Sprintf(`printf 'later-secret' | dd of=%s/regions/mem bs=1 seek=8192 conv=notrunc status=none; `+
		`printf 'changed-by-1' | dd of=%s/regions/mem bs=1 seek=200 conv=notrunc status=none`, h1, h1))
	counter := strings.TrimSpace(c.mustSh(t, fmt.Sprintf(`"$KRFS" atomic faa %s/regions/mem 512 0`, h1)))
	bad := func() int64 {
		s := c.mustSh(t, "cat "+h1+"/stats")
		m := regexp.MustCompile(`nic\.BadMAC (\d+)`).FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("no nic.BadMAC in host 1's stats:\n%s", s)
		}
		v, _ := strconv.ParseInt(m[1], 10, 64)
		return v
	}
	badBefore := bad()
	rep, err := exec.Command("nsenter", "--net=/run/netns/"+x, "python3", filepath.Join(dir, "replay.py"), capFile,
		"10.78.0.201", "10.78.0.2", "first-secret", "later-secret").CombinedOutput()
	if err != nil {
		t.Fatalf("replay: %v %s", err, rep)
	}
	t.Logf("replay: %s", strings.TrimSpace(string(rep)))
	if m := regexp.MustCompile(`leaked (\d+)`).FindStringSubmatch(string(rep)); m == nil || m[1] != "0" {
		t.Fatalf("the non-member received host 1's memory: %s", rep)
	}
	if got := strings.TrimSpace(c.mustSh(t, fmt.Sprintf(`"$KRFS" atomic faa %s/regions/mem 512 0`, h1))); got != counter {
		t.Fatalf("a replayed FETCH_ADD executed: counter %s, was %s", got, counter)
	}
	if got := c.mustSh(t, fmt.Sprintf(`dd if=%s/regions/mem bs=4096 count=1 status=none | head -c 212 | tail -c 12`, h1)); !strings.Contains(got, "changed-by-1") {
		t.Fatalf("a replayed WRITE rewound host 1's memory: %q", got)
	}
	if d := bad() - badBefore; d == 0 {
		t.Fatal("host 1 did not count the replayed packets as rejected")
	} else {
		t.Logf("host 1 rejected %d replayed packets", d)
	}
	// The members still work.
	out = c.mustSh(t, fmt.Sprintf(`dd if=%s/peers/1/mem bs=4096 skip=2 count=1 status=none | head -c 12`, h2))
	if !strings.Contains(out, "later-secret") {
		t.Fatalf("host 2's READ after the replay: %q", out)
	}
}
