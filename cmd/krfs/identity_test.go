package main

import (
	"context"
	"crypto/ed25519"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/meta"
	"github.com/krfs/krfs/nic"
	"github.com/krfs/krfs/node"
	"github.com/krfs/krfs/verbs"
)

// startIdentityNode starts a node on a softnic device at listen, as krfs
// mount does with flags f (its gid and key from nodeIdentity).
func startIdentityNode(t *testing.T, f *mountFlags, metaAddr netip.AddrPort) *node.Node {
	t.Helper()
	log := logrus.New()
	log.SetOutput(os.Stderr)
	id, err := nodeIdentity(log, f, nic.Softnic)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := openSoftnic(t, f.listen)
	if err != nil {
		t.Fatal(err)
	}
	cfg := node.Config{Device: dev, Meta: []netip.AddrPort{metaAddr}, MemSize: 4096, ShmDir: f.shmDir, NodeKey: id.key, Reclaimed: id.reclaimed}
	cfg.QPCore.GID = id.gid
	n, err := node.Start(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	dir := n.StoreDir()
	t.Cleanup(func() { n.Close(); shm.Purge(dir) })
	return n
}

// Rule (issue 31.6): a node remounted without --gid, on the same
// --listen, is the same node: it reclaims its gid and re-exports its
// regions; if another node (another key) holds that gid meanwhile, it
// takes a new one and the old store stays, listed by purge --list.
func TestRemountKeepsIdentity(t *testing.T) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm")
	}
	mdev, err := openSoftnic(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mdev.Close()
	srv, err := meta.NewServer(mdev, meta.ServerConfig{Slots: 64, FirstAssignedGID: uint32(15000000 + os.Getpid()%500000)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	probe, _ := openSoftnic(t, "127.0.0.1:0")
	listen := probe.Addr().String()
	probe.Close()
	f := &mountFlags{listen: listen, meta: srv.Addr().String()}

	n := startIdentityNode(t, f, srv.Addr())
	gid := n.Core().GID()
	dir := n.StoreDir()
	if dir != shm.DefaultDir(gid) {
		t.Fatalf("store %s for gid %d", dir, gid)
	}
	if _, err := n.Export("kept", 8192, 0o600, 0, 0); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if st, err := os.Stat(filepath.Join(dir, shm.KeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("node key file: %v", err)
	}

	// A crash-like restart (its lease is still live) without --gid.
	n = startIdentityNode(t, f, srv.Addr())
	if got := n.Core().GID(); got != gid || n.StoreDir() != dir {
		t.Fatalf("remount: gid %d in %s, want gid %d in %s", got, n.StoreDir(), gid, dir)
	}
	found := false
	for _, r := range n.Regions() {
		found = found || r.Name == "kept"
	}
	if !found {
		t.Fatalf("region kept not re-exported: %v", n.Regions())
	}
	n.Close()

	// Another node takes the gid; the remount then gets a new one.
	other, _ := openSoftnic(t, "127.0.0.1:0")
	oc, err := meta.NewClient(context.Background(), other, meta.ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, NodeKey: newTestKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	info := meta.NodeInfo{GID: gid, Addr: other.Addr()}
	ag, err := oc.Register(context.Background(), info, meta.AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	n = startIdentityNode(t, f, srv.Addr())
	newDir := n.StoreDir()
	if got := n.Core().GID(); got == gid || got == 0 {
		t.Fatalf("remount while another node holds gid %d: got gid %d", gid, got)
	}
	n.Close()
	ag.Close()
	oc.Close()
	other.Close()
	if _, err := os.Stat(filepath.Join(dir, "kept")); err != nil {
		t.Fatalf("the old store's region: %v", err)
	}
	// The next restart goes back to the store it used last, not to the
	// gid another node holds (which would make a new store every time).
	si, ok := shm.FindIdentity(listen)
	if !ok || si.Dir != newDir {
		t.Fatalf("FindIdentity: %+v %v, want the last store %s", si, ok, newDir)
	}
}

func newTestKey(t *testing.T) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// openSoftnic opens a softnic device at addr (port 0: any) through nic.
func openSoftnic(t *testing.T, addr string) (verbs.Device, error) {
	t.Helper()
	o, err := nic.Open(nic.Options{Backend: nic.Softnic, Listen: addr, DefaultListen: addr})
	if err != nil {
		return nil, err
	}
	return o.Dev, nil
}
