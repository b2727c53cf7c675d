package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/nic"
	"github.com/krfs/krfs/node"
)

// testNode starts an in-process node with an embedded meta service on
// loopback, its regions in a temporary directory.
func testNode(t *testing.T) *node.Node { return testNodeSized(t, 1<<20) }

// testNodeSized is testNode with a "mem" of mem bytes.
func testNodeSized(t *testing.T, mem int64) *node.Node {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	// --timeout is only a hang guard here (peer and meta queries): a
	// loaded machine must not turn into "peer listing empty".
	f := &mountFlags{shmDir: t.TempDir(), timeout: 2 * time.Minute, listen: "127.0.0.1:0"}
	n, err := startNode(log, f, nic.Softnic, nil, mem)
	if err != nil {
		t.Fatalf("starting a node: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// TestRes lists the QPs, regions and peers of an in-process node from the
// stats.json its backend writes.
func TestRes(t *testing.T) {
	d := testNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // hang guard
	defer cancel()
	c, err := d.Connect(ctx, d.Self())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(ctx, "mem", []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	dir := t.TempDir()
	d.SetFuseStats(func() fs.FuseStats {
		return fs.FuseStats{Transport: "io_uring", Queues: 2, EntriesPerQueue: 8, DevRequests: 3, RingRequests: 40, RingAsync: 2, RingPending: 30}
	})
	var js bytes.Buffer
	if err := d.Stats(&js, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stats.json"), js.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	res := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if err := runResArgs(append([]string{dir}, args...), &out, &errb); err != nil {
			t.Fatalf("res %v: %v %s", args, err, errb.String())
		}
		return out.String()
	}

	qp := res("qp")
	if !regexp.MustCompile(`(?m)^link softnic/1 lqpn \d+ type DCI state RTS sq-psn \d+ rq-psn \d+ `).MatchString(qp) ||
		!strings.Contains(qp, " type DCT ") {
		t.Errorf("res qp:\n%s", qp)
	}
	mr := res("mr")
	if !regexp.MustCompile(`(?m)^link softnic/1 rkey 0x[0-9a-f]+ mrlen 1048576 access \S+ name mem mode 0644 uid 0 gid 0$`).MatchString(mr) {
		t.Errorf("res mr:\n%s", mr)
	}
	peer := res("peer")
	want := regexp.MustCompile(`(?m)^link softnic/1 gid \d+ address 127\.0\.0\.1:\d+ incarnation 0x[0-9a-f]+ transport (dc|rc) .* self$`)
	if !want.MatchString(peer) {
		t.Errorf("res peer:\n%s", peer)
	}

	if got := res("fuse"); got != "transport io_uring queues 2 entries-per-queue 8 dev-requests 3 ring-requests 40 ring-async 2 ring-pending 30 fallback-copies 0\n" {
		t.Errorf("res fuse: %q", got)
	}
	var fuse map[string]any
	if err := json.Unmarshal([]byte(res("fuse", "-j")), &fuse); err != nil || fuse["transport"] != "io_uring" || fuse["entries_per_queue"] != 8.0 {
		t.Errorf("res fuse -j: %v %v", err, fuse)
	}

	var qps []node.ResQP
	if err := json.Unmarshal([]byte(res("qp", "-j")), &qps); err != nil || len(qps) == 0 {
		t.Fatalf("res qp -j: %v %d QPs", err, len(qps))
	}
	var mrs []node.ResMR
	if err := json.Unmarshal([]byte(res("-j", "mr")), &mrs); err != nil || len(mrs) != 1 || mrs[0].Name != "mem" || mrs[0].MRLen != 1<<20 {
		t.Fatalf("res mr -j: %v %+v", err, mrs)
	}

	var out, errb bytes.Buffer
	if err := runResArgs([]string{dir, "cq"}, &out, &errb); err == nil {
		t.Error("res cq succeeded")
	}
	if err := runResArgs([]string{t.TempDir(), "qp"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "not a running krfs mount") {
		t.Errorf("res on a plain directory: %v", err)
	}
}

// runResArgs runs `krfs res ARGS` and returns its error output as an error
// when it fails.
func runResArgs(args []string, stdout, stderr *bytes.Buffer) error {
	stderr.Reset()
	if code := run(append([]string{"krfs", "res"}, args...), stdout, stderr); code != 0 {
		return fmt.Errorf("exit %d: %s", code, stderr.String())
	}
	return nil
}
