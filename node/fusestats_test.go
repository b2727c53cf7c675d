package node

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/krfs/krfs/fs"
)

// Rule: the mount's FUSE transport shows in stats.json ("fuse") and in the
// metrics, which are there (zero) before a mount.
func TestFuseStatsInStatsAndMetrics(t *testing.T) {
	d := testNode(t)
	log := logrus.New()
	log.SetOutput(io.Discard)
	addr, stop, err := ServeMetrics(log, "127.0.0.1:0", Registry(d, NewOpMetrics()))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	url := "http://" + addr.String() + "/metrics"
	if m := scrape(t, url); m[`krfs_fuse_transport{transport="dev"}`] != 1 || m[`krfs_fuse_requests_total{path="ring"}`] != 0 {
		t.Errorf("metrics before a mount: %v %v", m[`krfs_fuse_transport{transport="dev"}`], m[`krfs_fuse_requests_total{path="ring"}`])
	}
	var js bytes.Buffer
	if err := d.Stats(&js, true); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(js.Bytes(), []byte(`"fuse"`)) {
		t.Error("stats.json has a fuse object before a mount")
	}

	d.SetFuseStats(func() fs.FuseStats {
		return fs.FuseStats{Transport: "io_uring", Queues: 2, EntriesPerQueue: 8, DevRequests: 3, RingRequests: 40, RingAsync: 2, RingPending: 30, FallbackCopies: 1, RingReregistered: 4, Stalls: 1}
	})
	m := scrape(t, url)
	for k, want := range map[string]float64{
		`krfs_fuse_transport{transport="io_uring"}`:        1,
		`krfs_fuse_transport{transport="dev"}`:             0,
		`krfs_fuse_ring_entries{what="queues"}`:            2,
		`krfs_fuse_ring_entries{what="entries_per_queue"}`: 8,
		`krfs_fuse_requests_total{path="dev"}`:             3,
		`krfs_fuse_requests_total{path="ring"}`:            38,
		`krfs_fuse_requests_total{path="ring_async"}`:      2,
		`krfs_fuse_ring_pending_total`:                     30,
		`krfs_fuse_fallback_copies_total`:                  1,
		`krfs_fuse_ring_reregistered_total`:                4,
		`krfs_fuse_stalls_total`:                           1,
	} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	js.Reset()
	if err := d.Stats(&js, true); err != nil {
		t.Fatal(err)
	}
	var st struct {
		Fuse map[string]any `json:"fuse"`
	}
	if err := json.Unmarshal(js.Bytes(), &st); err != nil || st.Fuse["transport"] != "io_uring" || st.Fuse["queues"] != 2.0 ||
		st.Fuse["entries_per_queue"] != 8.0 || st.Fuse["ring_requests"] != 40.0 || st.Fuse["dev_requests"] != 3.0 {
		t.Errorf("stats.json fuse: %v %v", err, st.Fuse)
	}
}
