package softnic_test

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/internal/leaktest"
	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/udplink"
)

// faults describe packet impairments. Over the fake network they are the
// network's own; over real UDP a lossyLink applies them on send.
type faults struct {
	drop, dup, reorder float64
}

// fabric makes links of one kind: the in-memory fake or real UDP on
// loopback. Every test of the shared suite runs over both.
type fabric struct {
	name  string
	t     testing.TB
	net   *softnictest.Network
	f     faults
	seed  uint64
	clock link.Clock
	open  func() link.Link // if set, makes every link (a test's own path)
}

var fabricKinds = []string{"fake", "udp"}

func newFabric(t testing.TB, kind string, f faults) *fabric {
	fb := &fabric{name: kind, t: t, f: f, seed: 1}
	if kind == "fake" {
		fb.net = softnictest.NewNetwork(softnictest.Config{Seed: 42, Drop: f.drop, Dup: f.dup, Reorder: f.reorder,
			ReorderDelay: 200 * time.Microsecond, Coalesce: coalesce})
		t.Cleanup(func() { fb.net.Close() })
		fb.clock = fb.net.Clock()
	}
	return fb
}

func (fb *fabric) link() link.Link {
	t := fb.t
	if fb.open != nil {
		return fb.open()
	}
	if fb.net != nil {
		return fb.net.NewLink()
	}
	l, err := udplink.Open(udplink.DefaultConfig("127.0.0.1:0"))
	if err != nil {
		t.Fatalf("udplink.Open: %v", err)
	}
	if fb.f != (faults{}) {
		fb.seed++
		return newLossyLink(l, fb.f, fb.seed)
	}
	return l
}

// node is one device with a PD, a CQ, and a registered memory region.
type node struct {
	t   testing.TB
	dev *softnic.Device
	pd  verbs.PD
	cq  verbs.CQ
	mem []byte
	mr  verbs.MR
}

const memSize = 1 << 20

func (fb *fabric) node() *node {
	t := fb.t
	dev, err := softnic.Open(softnic.Config{Link: fb.link(), Clock: fb.clock})
	if err != nil {
		t.Fatalf("softnic.Open: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(4096)
	if err != nil {
		t.Fatal(err)
	}
	mem := verbs.PageAligned(memSize) // zero-based: tests address it by offsets
	mr, err := pd.RegMR(mem, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	return &node{t: t, dev: dev, pd: pd, cq: cq, mem: mem, mr: mr}
}

func (n *node) rcQP() verbs.QP {
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: n.cq, RecvCQ: n.cq, Caps: verbs.QPCaps{MaxSendWR: 512, MaxRecvWR: 4096}})
	if err != nil {
		n.t.Fatal(err)
	}
	return q
}

// patientTimeout is the ACK timeout of QPs on a network that loses
// nothing. There the timer never needs to fire; in real time it fires
// only when the machine leaves the responder or the requester's receive
// path unscheduled (other processes compete for the 2 vCPUs), and
// RetryCnt+1 such firings without progress fail the WR with RETRY_EXC_ERR.
// A second makes that take 8 s of starvation: a hang guard, not a limit.
const patientTimeout = time.Second

// connect brings up an RC connection from a to b through the connection
// manager; b's QP gets its receive queue filled with recvs receive WRs.
// timeout is the QP's ACK timeout; 0 is patientTimeout.
func connect(t testing.TB, a, b *node, timeout time.Duration) (qa, qb verbs.QP) {
	t.Helper()
	if timeout == 0 {
		timeout = patientTimeout
	}
	svc := rand.Uint32()
	qb = b.rcQP()
	if err := b.dev.ListenRC(svc, func(req verbs.ConnRequest) (verbs.QP, []byte, error) {
		return qb, []byte("hello"), nil
	}); err != nil {
		t.Fatal(err)
	}
	qa = a.rcQP()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	priv, err := a.dev.ConnectRC(ctx, qa, b.dev.Addr(), svc, verbs.ConnParams{Timeout: timeout, RetryCnt: 7})
	if err != nil {
		t.Fatalf("ConnectRC: %v", err)
	}
	if string(priv) != "hello" {
		t.Fatalf("private data %q", priv)
	}
	if qa.State() != verbs.StateRTS || qb.State() != verbs.StateRTS {
		t.Fatalf("states after connect: %v %v", qa.State(), qb.State())
	}
	return qa, qb
}

// dct creates a DCT with an SRQ on n.
func (n *node) dct(key uint64) (verbs.QP, verbs.SRQ) {
	srq, err := n.pd.CreateSRQ(4096)
	if err != nil {
		n.t.Fatal(err)
	}
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.DCT, RecvCQ: n.cq, SRQ: srq, DCKey: key})
	if err != nil {
		n.t.Fatal(err)
	}
	if err := q.Modify(verbs.QPAttr{State: verbs.StateInit, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic}); err != nil {
		n.t.Fatal(err)
	}
	if err := q.Modify(verbs.QPAttr{State: verbs.StateRTR}); err != nil {
		n.t.Fatal(err)
	}
	return q, srq
}

// dci creates a DCI in RTS on n.
func (n *node) dci(timeout time.Duration) verbs.QP {
	q, err := n.pd.CreateQP(verbs.QPConfig{Type: verbs.DCI, SendCQ: n.cq, Caps: verbs.QPCaps{MaxSendWR: 512}})
	if err != nil {
		n.t.Fatal(err)
	}
	for _, st := range []verbs.QPState{verbs.StateInit, verbs.StateRTR, verbs.StateRTS} {
		if err := q.Modify(verbs.QPAttr{State: st, Timeout: timeout, RetryCnt: 7}); err != nil {
			n.t.Fatal(err)
		}
	}
	return q
}

func target(n *node, dct verbs.QP, key uint64) *verbs.DCTarget {
	return &verbs.DCTarget{Addr: n.dev.Addr(), DCTN: dct.QPN(), DCKey: key}
}

// pollGuard is the least time poll waits: completions that take
// microseconds on an idle machine can take seconds on a loaded one, so the
// wait only catches hangs.
const pollGuard = 2 * time.Minute

// poll collects exactly want completions from cq or fails after d (at
// least pollGuard).
func poll(t testing.TB, cq verbs.CQ, want int, d time.Duration) []verbs.WC {
	t.Helper()
	out := make([]verbs.WC, 0, want)
	buf := make([]verbs.WC, 64)
	ctx, cancel := context.WithTimeout(context.Background(), max(d, pollGuard))
	defer cancel()
	for len(out) < want {
		n := cq.Poll(buf[:min(len(buf), want-len(out))])
		out = append(out, buf[:n]...)
		if n == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("waiting for %d completions, got %d: %v", want, len(out), err)
			}
		}
	}
	return out
}

// post posts wrs or fails.
func post(t testing.TB, q verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	if err := q.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

func sge(n *node, off uint64, l uint32) verbs.SGE { return verbs.SGE{MR: n.mr, Offset: off, Length: l} }

// lossyLink wraps a real link and impairs what it sends: drop, duplicate,
// and reorder (a held packet goes out after the next send).
type lossyLink struct {
	link.Link
	f    faults
	mu   sync.Mutex
	rng  *rand.Rand
	held []heldPkt
}

type heldPkt struct {
	to       netip.AddrPort
	hdr, pay []byte
}

func newLossyLink(l link.Link, f faults, seed uint64) *lossyLink {
	return &lossyLink{Link: l, f: f, rng: rand.New(rand.NewPCG(seed, 7))}
}

func (l *lossyLink) Send(pkts []link.Packet) error {
	l.mu.Lock()
	out := make([]link.Packet, 0, len(pkts)+len(l.held)+1)
	release := l.held
	l.held = nil
	for _, p := range pkts {
		r := l.rng.Float64()
		switch {
		case r < l.f.drop:
			continue
		case r < l.f.drop+l.f.dup:
			out = append(out, p, p)
		case r < l.f.drop+l.f.dup+l.f.reorder:
			l.held = append(l.held, heldPkt{p.To, append([]byte(nil), p.Hdr...), append([]byte(nil), p.Payload...)})
		default:
			out = append(out, p)
		}
	}
	for _, h := range release {
		out = append(out, link.Packet{To: h.to, Hdr: h.hdr, Payload: h.pay})
	}
	l.mu.Unlock()
	return l.Link.Send(out)
}

// checkLeaks installs the goroutine leak check; call it first so its
// cleanup runs after the devices' cleanups.
func checkLeaks(t *testing.T) { leaktest.Check(t) }

var coalesce = 0.3

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
