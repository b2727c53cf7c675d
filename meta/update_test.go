package meta

import (
	"errors"
	"net/netip"
	"testing"
	"time"

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

// TestLookupWhileMetaDown: with every meta server down, a gid this
// client read before is answered from its last known entry (peers in
// use keep working); an unknown gid fails with ErrUnreachable, and a
// second failure comes at once, without another connect timeout.
func TestLookupWhileMetaDown(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	sdev := f.device()
	srv := startServer(t, sdev, ServerConfig{Slots: 64})
	// The devices' clock (real time here) times the connection attempts;
	// a reconnection backoff of at least 30 s keeps the server from being
	// dialed twice within the test.
	ccfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, CacheEntries: -1, RetryInterval: time.Minute,
		RPCTimeout: 200 * time.Millisecond, ConnectTimeout: 200 * time.Millisecond}
	reg := startClient(t, f.device(), ccfg)
	want, err := rawRegister(ctx, reg, testNode(3, 3), 0)
	if err != nil {
		t.Fatal(err)
	}
	c := startClient(t, f.device(), ccfg)
	if n, err := c.Lookup(ctx, 3); err != nil || n != want {
		t.Fatalf("lookup: %+v %v", n, err)
	}
	srv.Close()
	sdev.Close()
	if n, err := c.Lookup(ctx, 3); err != nil || n != want {
		t.Fatalf("known gid with the meta service down: %+v %v", n, err)
	}
	if c.Stats().LastKnown != 1 {
		t.Fatalf("LastKnown %d, want 1", c.Stats().LastKnown)
	}
	if _, err := c.Lookup(ctx, 4); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("unknown gid with the meta service down: %v", err)
	}
	s := c.servers[0]
	s.mu.Lock()
	tried := s.lastTry
	s.mu.Unlock()
	if _, err := c.Lookup(ctx, 5); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("unknown gid with the meta service down: %v", err)
	}
	// Within the backoff: the server is not dialed again.
	s.mu.Lock()
	again := s.lastTry != tried
	s.mu.Unlock()
	if again {
		t.Fatal("a lookup right after a failed connect dialed again")
	}
}
