package meta

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

func newKey(t testing.TB) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// keyCall sends one request on the client's first connection.
func keyCall(ctx context.Context, c *Client, m message) error {
	return c.each(ctx, func(cn *conn) (bool, error) {
		rep, err := cn.call(ctx, m)
		if err != nil {
			return false, err
		}
		return true, rep.status.err()
	})
}

// Rule (issue 31.10): an entry registered on a node key's session is that
// key's: another member - with a key of its own or none, claiming the
// victim's incarnation or its address - can neither deregister it,
// heartbeat it, nor overwrite it; the victim's entry is unchanged.
func TestMembersCannotTouchAnothersEntry(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	servers := []netip.AddrPort{srv.Addr()}
	victim := testNode(5, 0x51)
	a, err := startClient(t, f.device(), ClientConfig{Servers: servers, NodeKey: newKey(t)}).Register(ctx, victim, AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for name, key := range map[string]ed25519.PrivateKey{"another key": newKey(t), "no key": nil} {
		c := startClient(t, f.device(), ClientConfig{Servers: servers, NodeKey: key})
		seen, err := c.Lookup(ctx, 5) // what any member can read: gid, incarnation, address
		if err != nil || seen != victim {
			t.Fatalf("lookup: %+v %v", seen, err)
		}
		if err := keyCall(ctx, c, message{kind: kindDeregister, node: NodeInfo{GID: 5, Incarnation: seen.Incarnation}}); !errors.Is(err, ErrDenied) {
			t.Errorf("%s: deregister of another's entry: %v, want ErrDenied", name, err)
		}
		if err := keyCall(ctx, c, message{kind: kindHeartbeat, node: NodeInfo{GID: 5, Incarnation: seen.Incarnation}}); !errors.Is(err, ErrDenied) {
			t.Errorf("%s: heartbeat of another's entry: %v, want ErrDenied", name, err)
		}
		bogus := seen
		bogus.MemRKey, bogus.DirRKey = 0xbad, 0xbad
		for what, n := range map[string]NodeInfo{"same incarnation": bogus, "same address": testNode(5, 0x51|1<<40)} {
			n.Addr = victim.Addr
			if _, err := rawRegister(ctx, c, n, 0); !errors.Is(err, ErrDenied) {
				t.Errorf("%s: registration over another's entry (%s): %v, want ErrDenied", name, what, err)
			}
		}
	}
	got, err := startClient(t, f.device(), ClientConfig{Servers: servers}).LookupRPC(ctx, 5)
	if err != nil || got != victim {
		t.Fatalf("victim's entry after the attempts: %+v %v", got, err)
	}
	if st := srv.AuthStats(); st.Denied < 8 || st.Authenticated < 2 {
		t.Fatalf("auth stats %+v", st)
	}
}

// Rule: the same key with a new incarnation is the node restarted - at
// another address too - and takes its entry over at once.
func TestSameKeyTakesItsEntryOver(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	cfg := ClientConfig{Servers: []netip.AddrPort{srv.Addr()}, NodeKey: newKey(t)}
	if _, err := rawRegister(ctx, startClient(t, f.device(), cfg), testNode(9, 0x91), time.Minute); err != nil {
		t.Fatal(err)
	}
	again := testNode(9, 0x92) // another incarnation and address: a restart elsewhere
	if _, err := rawRegister(ctx, startClient(t, f.device(), cfg), again, time.Minute); err != nil {
		t.Fatalf("the same key re-registering: %v", err)
	}
	if got, err := startClient(t, f.device(), ClientConfig{Servers: cfg.Servers}).LookupRPC(ctx, 9); err != nil || got != again {
		t.Fatalf("entry after the restart: %+v %v", got, err)
	}
	// Without the key, the same request is refused.
	if _, err := rawRegister(ctx, startClient(t, f.device(), ClientConfig{Servers: cfg.Servers}), testNode(9, 0x93), time.Minute); !errors.Is(err, ErrDenied) {
		t.Fatalf("keyless takeover: %v", err)
	}
}

// Rule: one source IP registers at most MaxNodesPerSource live entries and
// RegisterBurst registrations at once; other sources are not affected.
func TestRegistrationFloodIsLimited(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 1024, Auth: AuthConfig{MaxNodesPerSource: 8, RegisterRate: 0.001, RegisterBurst: 12}})
	servers := []netip.AddrPort{srv.Addr()}
	flood := startClient(t, f.device(), ClientConfig{Servers: servers})
	ok, limited := 0, 0
	for i := range 40 {
		_, err := rawRegister(ctx, flood, testNode(uint32(100+i), uint64(0x1000+i)), time.Minute)
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrLimited):
			limited++
		default:
			t.Fatalf("registration %d: %v", i, err)
		}
	}
	if ok != 8 || limited != 32 {
		t.Fatalf("flood from one source: %d registered, %d limited; want 8 and 32", ok, limited)
	}
	// Refreshing an entry it holds is not a new one; the bucket (12, of
	// which 40 attempts took all) refuses even that now.
	if _, err := rawRegister(ctx, flood, testNode(100, 0x1000), time.Minute); !errors.Is(err, ErrLimited) {
		t.Fatalf("after the burst: %v", err)
	}
	other := startClient(t, f.deviceAt(netip.MustParseAddrPort("127.0.0.2:7000")), ClientConfig{Servers: servers})
	if _, err := rawRegister(ctx, other, testNode(7, 0x77), time.Minute); err != nil {
		t.Fatalf("another source: %v", err)
	}
	if n := len(srv.Nodes()); n != 9 {
		t.Fatalf("%d entries, want 9", n)
	}
}

// Rule: a server that requires node keys refuses keyless registrations; a
// captured auth signature proves nothing on another connection.
func TestNodeKeysRequiredAndNotReplayable(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64, Auth: AuthConfig{RequireNodeKeys: true}})
	servers := []netip.AddrPort{srv.Addr()}
	if _, err := rawRegister(ctx, startClient(t, f.device(), ClientConfig{Servers: servers}), testNode(3, 0x31), 0); !errors.Is(err, ErrDenied) {
		t.Fatalf("keyless registration: %v", err)
	}
	key := newKey(t)
	if _, err := rawRegister(ctx, startClient(t, f.device(), ClientConfig{Servers: servers, NodeKey: key}), testNode(3, 0x31), 0); err != nil {
		t.Fatalf("keyed registration: %v", err)
	}
	// Replay: hello with the victim's public key, then a signature made
	// for another connection's nonce.
	c := startClient(t, f.device(), ClientConfig{Servers: servers})
	pub := key.Public().(ed25519.PublicKey)
	err := c.each(ctx, func(cn *conn) (bool, error) {
		hello := message{kind: kindHello}
		copy(hello.blob[:], pub)
		if _, err := cn.call(ctx, hello); err != nil {
			return false, err
		}
		auth := message{kind: kindAuth}
		copy(auth.blob[:], ed25519.Sign(key, authChallenge(cn.boot.ServerIncarnation, make([]byte, authNonceLen), pub)))
		rep, err := cn.call(ctx, auth)
		if err != nil {
			return false, err
		}
		return true, rep.status.err()
	})
	if !errors.Is(err, ErrMalformed) || srv.AuthStats().BadAuth != 1 {
		t.Fatalf("replayed auth: %v, stats %+v", err, srv.AuthStats())
	}
	if err := keyCall(ctx, c, message{kind: kindDeregister, node: NodeInfo{GID: 3, Incarnation: 0x31}}); !errors.Is(err, ErrDenied) {
		t.Fatalf("deregister after a failed auth: %v", err)
	}
}

// Rule: members cannot write the table one-sided: client QPs and the DCT
// have remote READ access only, so a WRITE with the table's rkeys (the
// read-only one clients get, or the loopback's, were it guessed) fails
// and the table is unchanged.
func TestMembersCannotWriteTheTable(t *testing.T) {
	checkLeaks(t)
	f := fakeFabric(t)
	ctx := ctxT(t)
	srv := startServer(t, f.device(), ServerConfig{Slots: 64})
	servers := []netip.AddrPort{srv.Addr()}
	a, err := startClient(t, f.device(), ClientConfig{Servers: servers}).Register(ctx, testNode(4, 0x41), AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c := startClient(t, f.device(), ClientConfig{Servers: servers})
	src := make([]byte, 4096)
	for i := range src {
		src[i] = 0xee
	}
	for _, rkey := range []uint32{srv.tableRO.RKey(), srv.tableRW.RKey()} {
		err := c.each(ctx, func(cn *conn) (bool, error) {
			mr, err := c.pd.RegMR(src, verbs.AccessLocalWrite)
			if err != nil {
				return false, err
			}
			defer mr.Dereg()
			if err := cn.qp.PostSend([]verbs.SendWR{{ID: 1 << 40, Op: verbs.OpWrite, Flags: verbs.Signaled,
				Local: verbs.SGE{MR: mr, Length: uint32(len(src))}, RemoteAddr: 0, RKey: rkey}}); err != nil {
				return true, err
			}
			// The server refuses the WRITE: its error completion kills
			// the connection.
			waitFor(t, 0, "the WRITE's error completion", func() bool {
				cn.pollMu.Lock()
				cn.pollLocked()
				cn.pollMu.Unlock()
				return cn.isDead()
			})
			return true, nil
		})
		if err != nil {
			t.Fatalf("rkey %#x: %v", rkey, err)
		}
	}
	got, err := startClient(t, f.device(), ClientConfig{Servers: servers}).Lookup(ctx, 4)
	if err != nil || got != testNode(4, 0x41) {
		t.Fatalf("entry after the WRITEs: %+v %v", got, err)
	}
	if i := bytes.Index(srv.table, src[:32]); i >= 0 {
		t.Fatalf("a member's WRITE landed in the table at %d", i)
	}
}
