package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// forgeFirstFragments is run by python3 in a non-member namespace: it
// sends argv[3] forged first fragments (IPv4, more-fragments set, offset
// 0) of UDP datagrams to argv[1]:argv[2] from argv[4], each with its own
// IP ID, so that each one opens a reassembly queue that nothing completes.
const forgeFirstFragments = `
import socket, struct, sys
dst, port, count, src = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
body = bytes(1472)
for i in range(count):
    udp = struct.pack('!HHHH', 40000 + i % 20000, port, 8 + 8000, 0) + body
    hdr = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), i % 65536, 0x2000, 64, 17, 0,
                      socket.inet_aton(src), socket.inet_aton(dst))
    s.sendto(hdr + udp, (dst, 0))
`

// nsSnmp returns the Ip: counters of /proc/net/snmp in namespace ns.
func nsSnmp(t *testing.T, ns string) map[string]int64 {
	t.Helper()
	out, err := exec.Command("nsenter", "--net=/run/netns/"+ns, "cat", "/proc/net/snmp").Output()
	if err != nil {
		t.Fatalf("snmp of %s: %v", ns, err)
	}
	var names []string
	m := map[string]int64{}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "Ip: ") {
			continue
		}
		f := strings.Fields(line)[1:]
		if names == nil {
			names = f
			continue
		}
		for i, v := range f {
			if i < len(names) {
				m[names[i]], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return m
}

// nsFragMemory is the reassembly memory in use in namespace ns (bytes).
func nsFragMemory(t *testing.T, ns string) int64 {
	t.Helper()
	out, err := exec.Command("nsenter", "--net=/run/netns/"+ns, "cat", "/proc/net/sockstat").Output()
	if err != nil {
		t.Fatalf("sockstat of %s: %v", ns, err)
	}
	m := regexp.MustCompile(`FRAG: inuse \d+ memory (\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}

// TestFirstFragmentFlood: a namespace on the cluster's bridge that is not
// a member floods host 1 with forged first fragments until its IP
// reassembly memory is full (every fragmented datagram to host 1 is then
// dropped for ipfrag_time, 30 s); host 1's multi-packet operations (64 KiB
// READs and WRITEs to host 2) must still succeed, which they do only if
// no softnic datagram is ever IP-fragmented.
func TestFirstFragmentFlood(t *testing.T) {
	c := newCluster(t, 2)
	h1 := c.mnt(1)
	ns := c.prefix()
	x := c.nonMember(t, "x", "10.78.0.200")
	script := filepath.Join(c.dir, "forge.py")
	if err := os.WriteFile(script, []byte(forgeFirstFragments), 0o644); err != nil {
		t.Fatal(err)
	}

	ops := func(what string) error {
		// 64 KiB each way: many packets per operation.
		line := fmt.Sprintf("timeout 20 dd if=%s/peers/2/mem of=/dev/null bs=64k count=4 status=none && "+
			"head -c 262144 /dev/urandom | timeout 20 dd of=%s/peers/2/mem bs=64k conv=notrunc status=none", h1, h1)
		out, err := c.sh(45*time.Second, line)
		if err != nil {
			return fmt.Errorf("%s: %v %s", what, err, out)
		}
		return nil
	}
	before := nsSnmp(t, ns+"-h1")
	if err := ops("before the flood"); err != nil {
		t.Fatal(err)
	}
	after := nsSnmp(t, ns+"-h1")
	reasm := after["ReasmReqds"] - before["ReasmReqds"]

	out, err := exec.Command("nsenter", "--net=/run/netns/"+x, "python3", script, "10.78.0.1", "4791", "4000", "10.78.0.200").CombinedOutput()
	if err != nil {
		t.Fatalf("forging fragments: %v %s", err, out)
	}
	mem := nsFragMemory(t, ns+"-h1")
	t.Logf("host 1's reassembly memory after the flood: %d bytes; fragments reassembled for krfs before it: %d", mem, reasm)
	if mem < 2<<20 {
		t.Fatalf("the flood filled only %d bytes of host 1's reassembly memory: it did not attack anything", mem)
	}
	if err := ops("during the flood"); err != nil {
		if reasm > 0 {
			t.Skipf("depends on the path-MTU work of issue 10 (no softnic datagram may be IP-fragmented): "+
				"host 1 reassembled %d fragments of krfs traffic before the flood, and with its reassembly memory full: %v", reasm, err)
		}
		t.Fatal(err)
	}
	if reasm > 0 {
		t.Errorf("krfs traffic to host 1 was IP-fragmented (%d reassemblies) yet survived the flood: check the test", reasm)
	}
}
