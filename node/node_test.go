package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs/softnic"
)

func quietLog() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	return log
}

// startAt starts a node on a fresh loopback NIC with its regions in dir.
func startAt(t *testing.T, cfg Config) (*Node, error) {
	t.Helper()
	dev, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Device = dev
	if cfg.QPCore.PeerTimeout == 0 {
		cfg.QPCore.PeerTimeout = 2 * time.Second
	}
	return Start(context.Background(), cfg, quietLog())
}

// testNode starts an in-process node with an embedded meta service on
// loopback, a 1 MiB "mem" and its regions in a temporary directory.
func testNode(t *testing.T) *Node {
	t.Helper()
	n, err := startAt(t, Config{ShmDir: t.TempDir(), MemSize: 1 << 20})
	if err != nil {
		t.Fatalf("starting a node: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func TestParseMeta(t *testing.T) {
	got, err := ParseMeta(" 10.0.0.1:4790, ,10.0.0.2:4790")
	if err != nil || len(got) != 2 || got[1] != netip.MustParseAddrPort("10.0.0.2:4790") {
		t.Fatalf("ParseMeta: %v %v", got, err)
	}
	if got, err := ParseMeta(""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v %v", got, err)
	}
	if _, err := ParseMeta("10.0.0.1"); err == nil {
		t.Fatal("a HOST without a port was accepted")
	}
}

// A node with an embedded meta service gets a gid, exports "mem", and
// reaches itself through the fs.Backend.
func TestStartEmbedded(t *testing.T) {
	leaktest.Check(t)
	n := testNode(t)
	if n.Self() == 0 || n.Core().GID() != n.Self() {
		t.Fatalf("gid %d, core %d", n.Self(), n.Core().GID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	peers, err := n.Peers(ctx)
	if err != nil || len(peers) != 1 || peers[0] != n.Self() {
		t.Fatalf("peers %v %v", peers, err)
	}
	c, err := n.Connect(ctx, n.Self())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.WriteAt(ctx, "mem", []byte("hello"), 100); err != nil {
		t.Fatal(err)
	}
	lr, err := n.LocalRegion("mem")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := lr.ReadAt(got, 100); err != nil || string(got) != "hello" {
		t.Fatalf("local read %q %v", got, err)
	}
	if err := n.Unexport("mem"); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("unexport mem: %v", err)
	}
	if _, err := n.Export("bad/name", 8, 0o600, 0, 0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("bad name: %v", err)
	}
}

// Regions survive a restart of the node: their data comes back from
// shared memory, with their modes and owners, under new keys.
func TestRegionsRecoveredFromSharedMemory(t *testing.T) {
	leaktest.Check(t)
	dir := t.TempDir()
	n, err := startAt(t, Config{ShmDir: dir, MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Export("kept", 8192, 0o640, 7, 8); err != nil {
		t.Fatal(err)
	}
	lr, err := n.LocalRegion("kept")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lr.WriteAt([]byte("survives"), 4000); err != nil {
		t.Fatal(err)
	}
	var rkey uint32
	for _, r := range n.Core().Regions() {
		if r.Name == "kept" {
			rkey = r.RKey
		}
	}
	n.Close()

	m, err := startAt(t, Config{ShmDir: dir, MemSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var found *qpcore.Region
	for _, r := range m.Core().Regions() {
		if r.Name == "kept" {
			found = &r
		}
	}
	if found == nil || found.Len != 8192 || found.Mode&0o777 != 0o640 || found.UID != 7 || found.GID != 8 {
		t.Fatalf("recovered region: %+v", found)
	}
	if found.RKey == rkey {
		t.Error("recovered under the old rkey")
	}
	lr, err = m.LocalRegion("kept")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if _, err := lr.ReadAt(got, 4000); err != nil || !bytes.Equal(got, []byte("survives")) {
		t.Fatalf("data after restart %q %v", got, err)
	}
}

// A node that does not register still reaches registered ones; a node
// whose meta service does not answer fails to start with a clear error
// and closes its device.
func TestNoRegisterAndUnreachableMeta(t *testing.T) {
	leaktest.Check(t)
	srv := testNode(t)
	cl, err := startAt(t, Config{Meta: []netip.AddrPort{srv.Device().Addr()}, NoRegister: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if cl.Self() != 0 {
		t.Fatalf("unregistered node has gid %d", cl.Self())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := cl.Core().Connect(ctx, srv.Self())
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Write(ctx, []byte("x"), "mem", 0); err != nil {
		t.Fatal(err)
	}
	v.Close()

	// Nobody listens on the meta address: a NIC that was closed.
	gone, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := gone.Addr()
	gone.Close()
	_, err = startAt(t, Config{Meta: []netip.AddrPort{addr}, StartTimeout: 300 * time.Millisecond})
	if err == nil {
		t.Fatal("started without a meta service")
	}
	t.Logf("unreachable meta: %v", err)
}

// A node started before its meta service waits for it (within
// StartTimeout) and starts once the service is up, instead of failing
// after one connection attempt.
func TestStartWaitsForTheMetaService(t *testing.T) {
	leaktest.Check(t)
	// The address the meta service will have: taken, then freed.
	spot, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := spot.Addr()
	spot.Close()

	// Until the service starts, a plain socket holds its address and
	// sees the node's connection requests arrive: the node is trying.
	watch, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := softnic.OpenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	var cl *Node
	go func() {
		var err error
		cl, err = Start(context.Background(), Config{Device: dev, Meta: []netip.AddrPort{addr},
			StartTimeout: time.Minute, ShmDir: t.TempDir(), MemSize: 4096,
			QPCore: qpcore.Config{PeerTimeout: 2 * time.Second}}, quietLog())
		started <- err
	}()
	// It keeps trying past one connection attempt's timeout.
	buf := make([]byte, 2048)
	var first time.Time
	for first.IsZero() || time.Since(first) < meta.DefaultConnectTimeout*3/2 {
		watch.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang guard
		if _, from, err := watch.ReadFromUDPAddrPort(buf); err != nil || from.Port() != dev.Addr().Port() {
			t.Fatalf("connection requests from the node stopped after %v (%v from %v)", time.Since(first), err, from)
		}
		if first.IsZero() {
			first = time.Now()
		}
	}
	watch.Close()
	select {
	case err := <-started:
		t.Fatalf("Start returned before the meta service was up: %v", err)
	default:
	}
	mdev, err := softnic.OpenUDP(addr.String())
	if err != nil {
		t.Fatalf("the meta service's address was taken meanwhile: %v", err)
	}
	srv, err := Start(context.Background(), Config{Device: mdev, ShmDir: t.TempDir(), MemSize: 4096,
		QPCore: qpcore.Config{PeerTimeout: 2 * time.Second}}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := <-started; err != nil {
		t.Fatalf("Start after the meta service came up: %v", err)
	}
	defer cl.Close()
	if cl.Self() == 0 || cl.Self() == srv.Self() {
		t.Fatalf("registered as gid %d (meta host %d)", cl.Self(), srv.Self())
	}
}
