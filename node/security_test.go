package node

import (
	"bytes"
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// statsOf renders the node's stats file.
func statsOf(t *testing.T, n *Node) string {
	t.Helper()
	var b bytes.Buffer
	if err := n.Stats(&b, false); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// statCounter reads "name value" from a stats file (-1 if absent).
func statCounter(stats, name string) int64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\d+)$`).FindStringSubmatch(stats)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}

// TestSecurityCountersVisible: a NIC's authentication and
// connection-manager counters (verbs.SecurityReporter) reach the stats
// file and the metrics. A keyed node gets, from a plain UDP socket, a
// packet with a forged tag and one of wire version 1: both are dropped
// and show up by name (auth.NoSession, nic.BadVersion) and as
// krfs_auth_dropped_total{reason="no_session"} and
// krfs_nic_rx_dropped_total{reason="bad_version"}; its own session (the
// embedded meta service) shows as a handshake. A node without a key has
// the cm section but no auth section and no krfs_auth_ metric.
func TestSecurityCountersVisible(t *testing.T) {
	dev, err := softnic.OpenUDPKey("127.0.0.1:0", []byte("node test cluster key 32 bytes.."))
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(context.Background(), Config{Device: dev, ShmDir: t.TempDir(), MemSize: 1 << 20}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()

	st := statsOf(t, n)
	for _, name := range []string{"auth.Handshakes", "auth.NoSession", "auth.Replayed", "cm.CookiesSent", "cm.Records", "nic.BadVersion"} {
		if statCounter(st, name) < 0 {
			t.Fatalf("no %s in the stats of a keyed node:\n%s", name, st)
		}
	}
	if statCounter(st, "auth.Handshakes") < 1 {
		t.Fatalf("auth.Handshakes %d: the node talks to its embedded meta service in a session", statCounter(st, "auth.Handshakes"))
	}
	noSession, badVersion := statCounter(st, "auth.NoSession"), statCounter(st, "nic.BadVersion")

	u, err := net.Dial("udp", dev.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	forged := (&wire.Header{Op: wire.OpReadReq, Flags: wire.FlagMAC, DestQP: 1, RespMTU: 1024, DMALen: 8}).Append(nil)
	old := append([]byte{wire.Magic, 1, byte(wire.OpReadReq), 0}, make([]byte, 40)...)
	for _, p := range [][]byte{forged, old} {
		if _, err := u.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	// The NIC's receive path counts them; wait for that event (a hang
	// guard, not a timing assumption).
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		st = statsOf(t, n)
		if statCounter(st, "auth.NoSession") > noSession && statCounter(st, "nic.BadVersion") > badVersion {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forged and old packets were not counted:\n%s", st)
		}
	}

	ops := NewOpMetrics()
	addr, stop, err := ServeMetrics(quietLog(), "127.0.0.1:0", Registry(n, ops))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	m := scrape(t, "http://"+addr.String()+"/metrics")
	for name, min := range map[string]float64{
		`krfs_auth_dropped_total{reason="no_session"}`:    float64(noSession + 1),
		`krfs_nic_rx_dropped_total{reason="bad_version"}`: float64(badVersion + 1),
		`krfs_auth_handshakes_total`:                      1,
	} {
		if v, ok := m[name]; !ok || v < min {
			t.Errorf("%s = %v (present %v), want at least %v", name, v, ok, min)
		}
	}
	for _, name := range []string{`krfs_auth_sessions`, `krfs_cm_records`, `krfs_cm_cookies_sent_total`,
		`krfs_auth_dropped_total{reason="replayed"}`, `krfs_cm_limit_rejects_total`} {
		if _, ok := m[name]; !ok {
			t.Errorf("no %s", name)
		}
	}

	// Without a key: the CM's counters, nothing of authentication.
	plain := testNode(t)
	st = statsOf(t, plain)
	if statCounter(st, "cm.CookiesSent") < 0 || strings.Contains(st, "auth.") {
		t.Fatalf("stats of a node without a key:\n%s", st)
	}
	addr2, stop2, err := ServeMetrics(quietLog(), "127.0.0.1:0", Registry(plain, NewOpMetrics()))
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	m = scrape(t, "http://"+addr2.String()+"/metrics")
	if _, ok := m[`krfs_cm_records`]; !ok {
		t.Error("no krfs_cm_records without a key")
	}
	for k := range m {
		if strings.HasPrefix(k, "krfs_auth_") {
			t.Errorf("%s without a key", k)
		}
	}
}
