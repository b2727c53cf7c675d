package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// forgeCMRequests is run by python3 in a non-member namespace: it sends
// argv[3] softnic CM_REQ packets (wire version 2) for service argv[4] to argv[1]:argv[2],
// each from its own forged source address in 198.18.0.0/15 (a benchmark
// range nobody routes, so replies go nowhere and no ARP entry is made),
// half of them with a guessed cookie.
const forgeCMRequests = `
import socket, struct, sys
dst, port, count, service = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4], 0)
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for i in range(count):
    cm = struct.pack('!BBBBIII', 0x4B, 2, 9, 0, 0, 0, 0) + struct.pack('!IIIIQQ', service, 1 + i, 1, 4096, i, (i | 1) if i % 2 else 0)
    udp = struct.pack('!HHHH', 4791, port, 8 + len(cm), 0) + cm
    src = socket.inet_aton('198.18.%d.%d' % ((i >> 8) & 255, i & 255))
    hdr = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), i % 65536, 0x4000, 64, 17, 0, src, socket.inet_aton(dst))
    r.sendto(hdr + udp, (dst, 0))
`

// TestForgedConnectionFlood is issue 11's connection flood, without a
// cluster key: a non-member on the bridge sends 5,000 forged CM requests
// to the meta service and 5,000 to host 1's RC service. Before, they
// filled the meta's 4,096-connection table (joins refused for ~75 s) and
// host 1's passive RC pool. Now they get a cookie and nothing else: a
// restarted host rejoins at once and reaches host 1 over a new connection.
func TestForgedConnectionFlood(t *testing.T) {
	c := newCluster(t, 2)
	h1, h2 := c.mnt(1), c.mnt(2)
	x := c.nonMember(t, "f", "10.78.0.202")
	script := filepath.Join(t.TempDir(), "forge.py")
	if err := os.WriteFile(script, []byte(forgeCMRequests), 0o644); err != nil {
		t.Fatal(err)
	}
	c.mustSh(t, fmt.Sprintf(`printf 'host-1-data' | dd of=%s/regions/mem bs=1 conv=notrunc status=none`, h1))
	for _, target := range [][]string{{"10.78.0.254", "4790", "0x4b524d53"}, {"10.78.0.1", "4791", "0x4b524301"}} {
		out, err := exec.Command("nsenter", "--net=/run/netns/"+x, "python3", script, target[0], target[1], "5000", target[2]).CombinedOutput()
		if err != nil {
			t.Fatalf("forging CM requests to %s: %v %s", target[0], err, out)
		}
	}
	// Joins work at once: host 2 restarts (a new registration and new
	// connections to the meta service and to host 1).
	if out, err := c.script("restart", "2"); err != nil {
		t.Fatalf("host 2 could not rejoin after the flood: %v\n%s", err, out)
	}
	out := c.mustSh(t, fmt.Sprintf(`dd if=%s/peers/1/mem bs=4096 count=1 status=none | head -c 11`, h2))
	if !strings.Contains(out, "host-1-data") {
		t.Fatalf("host 2 could not read host 1 after the flood: %q", out)
	}
	if st := c.mustSh(t, "cat "+h1+"/stats"); strings.Contains(st, "nic.BadMAC") {
		t.Logf("host 1 after the flood:\n%s", grepLines(st, "nic.", "qp"))
	}
}

// grepLines keeps the lines of s that contain one of words.
func grepLines(s string, words ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
