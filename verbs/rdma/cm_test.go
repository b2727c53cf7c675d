package rdma

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
)

// fakeQP is an RC QP as the connection manager sees it.
type fakeQP struct {
	verbs.QP // nil: only the methods below are called
	qpn      uint32
	mu       sync.Mutex
	state    verbs.QPState
	peer     endpoint
	sqPSN    uint32
	params   verbs.ConnParams
}

func (q *fakeQP) QPN() uint32 { return q.qpn }

// snap returns what bringUp recorded.
func (q *fakeQP) snap() fakeQP {
	q.mu.Lock()
	defer q.mu.Unlock()
	return fakeQP{qpn: q.qpn, state: q.state, peer: q.peer, sqPSN: q.sqPSN, params: q.params}
}

func (q *fakeQP) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// fakeHost is a device port without hardware.
type fakeHost struct {
	gid GID
	lid uint16
	mtu int

	mu   sync.Mutex
	fail error // bringUp fails with it
}

func (h *fakeHost) localPort() (GID, uint16, uint8) { return h.gid, h.lid, 1 }
func (h *fakeHost) maxMTU() int                     { return h.mtu }
func (h *fakeHost) ownRC(q verbs.QP) error {
	f, ok := q.(*fakeQP)
	if !ok {
		return verbs.ErrInvalidArg
	}
	if f.State() != verbs.StateReset {
		return verbs.ErrQPState
	}
	return nil
}
func (h *fakeHost) bringUp(q verbs.QP, peer endpoint, sqPSN uint32, p verbs.ConnParams) error {
	h.mu.Lock()
	fail := h.fail
	h.mu.Unlock()
	if fail != nil {
		return fail
	}
	f := q.(*fakeQP)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.peer, f.sqPSN, f.params = verbs.StateRTS, peer, sqPSN, p
	return nil
}

func newCM(t *testing.T, h *fakeHost) *cmConn {
	t.Helper()
	c, err := listenCM(h, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestCMConnects(t *testing.T) {
	ha := &fakeHost{gid: GIDFromIP(netip.MustParseAddr("10.0.0.1")), lid: 1, mtu: 4096}
	hb := &fakeHost{gid: GIDFromIP(netip.MustParseAddr("10.0.0.2")), lid: 2, mtu: 1024}
	a, b := newCM(t, ha), newCM(t, hb)
	qa, qb := &fakeQP{qpn: 100}, &fakeQP{qpn: 200}
	var mu sync.Mutex // the accept function runs on b's CM goroutine
	accepts := 0
	var req verbs.ConnRequest
	if err := b.listen(5, func(r verbs.ConnRequest) (verbs.QP, []byte, error) {
		mu.Lock()
		defer mu.Unlock()
		accepts++
		req = r
		return qb, []byte("welcome"), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.listen(5, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return nil, nil, nil }); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Fatalf("duplicate listen: %v", err)
	}
	priv, err := a.connect(ctx(t), qa, b.addr, 5, verbs.ConnParams{Private: []byte("hi"), Timeout: time.Second, RetryCnt: 3})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if string(priv) != "welcome" || string(req.Private) != "hi" || req.RemoteQPN != 100 || req.RemoteAddr != a.addr || accepts != 1 {
		t.Fatalf("private %q, request %+v, %d accepts", priv, req, accepts)
	}
	sa, sb := qa.snap(), qb.snap()
	// Each side learned the other's QPN, start PSN, GID and LID; the MTU
	// is the smaller one; the active side's parameters reached bringUp.
	if sa.peer.QPN != 200 || sb.peer.QPN != 100 || sa.peer.PSN != sb.sqPSN || sb.peer.PSN != sa.sqPSN {
		t.Fatalf("QPN/PSN exchange: a %+v sq %d, b %+v sq %d", sa.peer, sa.sqPSN, sb.peer, sb.sqPSN)
	}
	if sa.peer.GID != hb.gid || sb.peer.GID != ha.gid || sa.peer.LID != 2 || sb.peer.LID != 1 {
		t.Fatalf("GID/LID exchange: %+v %+v", sa.peer, sb.peer)
	}
	if sa.peer.MTU != 1024 || sb.peer.MTU != 1024 || sa.params.RetryCnt != 3 || sa.params.Timeout != time.Second {
		t.Fatalf("MTU %d/%d, params %+v", sa.peer.MTU, sb.peer.MTU, sa.params)
	}
	// The connection taught a where b is: no query needed.
	if e, err := a.resolve(ctx(t), b.addr); err != nil || e.GID != hb.gid {
		t.Fatalf("resolve after connect: %+v, %v", e, err)
	}
	if _, err := a.connect(ctx(t), qa, b.addr, 5, verbs.ConnParams{}); !errors.Is(err, verbs.ErrQPState) {
		t.Fatalf("connecting a connected QP: %v", err)
	}
}

func TestCMRepeatedRequestAcceptsOnce(t *testing.T) {
	hb := &fakeHost{mtu: 4096}
	b := newCM(t, hb)
	accepts := 0
	b.listen(1, func(verbs.ConnRequest) (verbs.QP, []byte, error) {
		accepts++
		return &fakeQP{qpn: uint32(accepts)}, nil, nil
	})
	from := netip.MustParseAddrPort("127.0.0.1:9") // discard: replies go nowhere
	req := cmMsg{Kind: cmReq, ConnID: 42, Service: 1, QPN: 7, MTU: 4096}
	b.onMsg(from, req)
	b.onMsg(from, req)
	if accepts != 1 {
		t.Fatalf("a repeated REQ was accepted %d times", accepts)
	}
	b.onMsg(from, cmMsg{Kind: cmRTU, ConnID: 42})
	b.onMsg(from, req)
	if accepts != 2 {
		t.Fatalf("after RTU a REQ with the same ID is new; accepts %d", accepts)
	}
}

func TestCMRejections(t *testing.T) {
	a, b := newCM(t, &fakeHost{mtu: 4096}), newCM(t, &fakeHost{mtu: 4096})
	q := &fakeQP{qpn: 1}
	if _, err := a.connect(ctx(t), q, b.addr, 9, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMRejected) || !strings.Contains(err.Error(), "no listener") {
		t.Fatalf("no listener: %v", err)
	}
	b.listen(9, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return nil, nil, errors.New("full house") })
	if _, err := a.connect(ctx(t), q, b.addr, 9, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMRejected) || !strings.Contains(err.Error(), "full house") {
		t.Fatalf("refused: %v", err)
	}
	b.stopListen(9)
	b.listen(9, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return &fakeQP{}, nil, nil })
	hb := b.host.(*fakeHost)
	hb.mu.Lock()
	hb.fail = errors.New("modify failed")
	hb.mu.Unlock()
	if _, err := a.connect(ctx(t), q, b.addr, 9, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMRejected) || !strings.Contains(err.Error(), "modify failed") {
		t.Fatalf("passive bring-up failure: %v", err)
	}
	if err := b.stopListen(10); err == nil {
		t.Fatal("stopping an unknown service succeeded")
	}
	if _, err := a.connect(ctx(t), q, b.addr, 9, verbs.ConnParams{Private: make([]byte, MaxPrivate+1)}); !errors.Is(err, verbs.ErrLength) {
		t.Fatalf("oversized private data: %v", err)
	}
	if q.State() != verbs.StateReset {
		t.Fatal("a failed connect left the QP moved")
	}
}

func TestCMTimeoutAndResolve(t *testing.T) {
	a, b := newCM(t, &fakeHost{mtu: 4096}), newCM(t, &fakeHost{gid: GID{0xfe, 0x80, 15: 9}, lid: 77, mtu: 4096})
	e, err := a.resolve(ctx(t), b.addr)
	if err != nil || e.GID != (GID{0xfe, 0x80, 15: 9}) || e.LID != 77 {
		t.Fatalf("resolve: %+v, %v", e, err)
	}
	if self, err := a.resolve(ctx(t), a.addr); err != nil || self.LID != 0 {
		t.Fatalf("resolve self: %+v, %v", self, err)
	}
	dead := b.addr
	b.close()
	// A target that failed is forgotten (a DCI's retry error): the next
	// resolve asks again, and nobody answers now.
	a.forget(dead)
	// Nothing answers at dead: the connect ends with the context, which
	// is the expected outcome (no success path depends on this timer).
	c, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := a.connect(c, &fakeQP{}, dead, 1, verbs.ConnParams{}); !errors.Is(err, verbs.ErrCMTimeout) {
		t.Fatalf("connect to nobody: %v", err)
	}
	if _, err := a.resolve(context.Background(), dead); !errors.Is(err, verbs.ErrNoSuchTarget) {
		t.Fatalf("resolve nobody: %v", err)
	}
}

func TestCMPublishesARoutableAddress(t *testing.T) {
	c, err := listenCM(&fakeHost{mtu: 4096}, ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if _, ok := hostIP(); ok && c.addr.Addr().IsUnspecified() {
		t.Fatalf("CM bound to all interfaces publishes %v", c.addr)
	}
	if c.addr.Port() == 0 {
		t.Fatalf("CM address %v has no port", c.addr)
	}
}
