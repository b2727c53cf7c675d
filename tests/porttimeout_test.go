package tests

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPortSendBoundedByTimeout is issue 11's "--timeout is a hard bound on
// every operation" for messages: a receiver whose receive buffers are all
// held by full ports answers every further SEND with RNR, and a write to
// one of its ports must fail within --timeout (+ 1.5 s of slack, as the
// issue's loss test allows), not after qpcore's 10 s message timeout.
//
// Host 2 binds five ports; host 1 fills four of them (16 messages each,
// the default --port-depth: 64 messages hold the 64 receive buffers),
// then writes to the fifth.
func TestPortSendBoundedByTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	t.Setenv("KRFS_MOUNT_FLAGS", strings.TrimSpace(os.Getenv("KRFS_MOUNT_FLAGS")+" --timeout "+timeout.String()))
	c := newCluster(t, 2)
	h1, h2 := c.mnt(1), c.mnt(2)
	for p := 1; p <= 5; p++ {
		c.mustSh(t, fmt.Sprintf("touch %s/ports/%d", h2, p))
	}
	for p := 1; p <= 4; p++ {
		c.mustSh(t, fmt.Sprintf(`for i in $(seq 1 16); do printf 'msg-%d-%%s' $i > %s/peers/2/ports/%d || exit 1; done`, p, h1, p))
	}
	// Timed inside the shell, around the write alone: starting bash on
	// a loaded machine is not part of the operation.
	out, err := c.sh(hangGuard, fmt.Sprintf(`s=$(date +%%s%%N); printf 'one-too-many' > %s/peers/2/ports/5; rc=$?; `+
		`echo "elapsed-ns $(( $(date +%%s%%N) - s ))"; exit $rc`, h1))
	m := regexp.MustCompile(`elapsed-ns (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no elapsed time: %v %s", err, out)
	}
	ns, _ := strconv.ParseInt(m[1], 10, 64)
	el := time.Duration(ns)
	t.Logf("write to a port of a receiver out of buffers: %v after %v: %s", err, el.Round(time.Millisecond), strings.TrimSpace(out))
	if err == nil {
		t.Fatal("the write succeeded: the receiver was not out of receive buffers, the test proves nothing")
	}
	if limit := timeout + 1500*time.Millisecond; el > limit {
		t.Fatalf("the write took %v, more than --timeout %v + 1.5 s", el.Round(time.Millisecond), timeout)
	}
	if st := c.mustSh(t, "cat "+h1+"/stats"); !strings.Contains(st, "node.RNRRetries") {
		t.Fatalf("no node.RNRRetries in host 1's stats:\n%s", st)
	} else {
		t.Logf("host 1: %s", grepLines(st, "RNRRetries", "OpTimeouts"))
	}

	// Once a port is read, its buffers are posted again and messages
	// flow: the timeout failed one write, not the peer.
	got := c.mustSh(t, fmt.Sprintf(`python3 -c '
import os
fd = os.open("%s/ports/1", os.O_RDONLY | os.O_NONBLOCK)
n = 0
while True:
    try:
        os.read(fd, 4096)
    except BlockingIOError:
        break
    n += 1
print(n)'`, h2))
	if strings.TrimSpace(got) != "16" {
		t.Fatalf("read %q messages from port 1, want 16", strings.TrimSpace(got))
	}
	c.mustSh(t, fmt.Sprintf("printf 'after-drain' > %s/peers/2/ports/5", h1))
	// The failed write must not have delivered its message either.
	got = c.mustSh(t, fmt.Sprintf(`python3 -c '
import os
fd = os.open("%s/ports/5", os.O_RDONLY | os.O_NONBLOCK)
while True:
    try:
        print(os.read(fd, 4096).decode())
    except BlockingIOError:
        break'`, h2))
	if strings.TrimSpace(got) != "after-drain" {
		t.Fatalf("port 5 after the drain holds %q, want only after-drain", got)
	}
}
