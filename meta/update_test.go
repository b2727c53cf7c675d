package meta

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/krfs/krfs/verbs"
)

// TestAgentUpdate: a registered node publishes its default region and
// transport after registering; a new lookup (a cold peer) reads them from
// the table, with gid and incarnation unchanged.
func TestAgentUpdate(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}}
	info := testNode(5, 9)
	info.MemRKey, info.MemLen, info.MemAccess, info.Transport = 0, 0, 0, "softnic/udp"
	a, err := startClient(t, f.device(), ccfg).Register(ctx, info, AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	upd := info
	upd.MemRKey, upd.MemLen, upd.MemAccess, upd.GID, upd.Incarnation = 0xabcd, 1<<20, verbs.AccessRemoteRead, 0, 0
	if err := a.Update(ctx, upd); err != nil {
		t.Fatal(err)
	}
	got, err := startClient(t, f.device(), ccfg).Lookup(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := info
	want.MemRKey, want.MemLen, want.MemAccess = 0xabcd, 1<<20, verbs.AccessRemoteRead
	if got != want {
		t.Fatalf("after Update: %+v, want %+v", got, want)
	}
	bad := want
	bad.Transport = "a transport name too long"
	if err := a.Update(ctx, bad); err == nil {
		t.Fatal("Update with an unstorable transport name succeeded")
	}
	if _, err := startClient(t, f.device(), ccfg).Register(ctx, bad, AgentConfig{}); err == nil || errors.Is(err, ErrUnreachable) {
		t.Fatalf("Register with an unstorable transport name: %v", err)
	}
}
