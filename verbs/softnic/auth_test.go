package softnic_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/softnictest"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

// capture records the raw datagrams the fake network carries.
type capture struct {
	mu   sync.Mutex
	pkts []captured
}

type captured struct {
	from, to netip.AddrPort
	op       wire.Opcode
	raw      []byte
}

func (c *capture) filter(from, to netip.AddrPort, h wire.Header, payload []byte) softnictest.Verdict {
	if h.Op == 0 {
		return softnictest.Pass // no softnic header: a device's receive-path probe to itself
	}
	c.mu.Lock()
	c.pkts = append(c.pkts, captured{from, to, h.Op, append(h.Append(nil), payload...)})
	c.mu.Unlock()
	return softnictest.Pass
}

func (c *capture) take() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pkts
	c.pkts = nil
	return p
}

func keyedNodeCfg(fb *fabric, cfg softnic.Config) *node {
	t := fb.t
	cfg.Link, cfg.Clock = fb.link(), fb.clock
	dev, err := softnic.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(4096)
	mem := make([]byte, memSize)
	mr, err := pd.RegMR(mem, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	return &node{t: t, dev: dev, pd: pd, cq: cq, mem: mem, mr: mr}
}

// TestReplayFromOutsiderAndSpoofed is issue 11's capture-and-replay: an
// outsider captures a member's CM request, WRITE, READ and FETCH_ADD
// (over RC and DC) and sends them again, from its own address and with the
// member's address forged. Nothing executes again, nothing is answered,
// and every replay is counted.
func TestReplayFromOutsiderAndSpoofed(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(map[bool]string{false: "mac", true: "aead"}[enc], func(t *testing.T) {
			fb := newFabric(t, "fake", faults{})
			var capt capture
			fb.net.SetFilter(capt.filter)
			cfg := softnic.Config{ClusterKey: []byte("cluster secret 16+"), Encrypt: enc}
			a, b := keyedNodeCfg(fb, cfg), keyedNodeCfg(fb, cfg)
			outsider := fb.net.NewLink() // a non-member's socket
			var seen sync.Mutex
			var toOutsider [][]byte
			outsider.Start(recvFunc(func(_ netip.AddrPort, hdr, payload []byte) {
				seen.Lock()
				toOutsider = append(toOutsider, append(append([]byte(nil), hdr...), payload...))
				seen.Unlock()
			}))
			qa, _ := connect(t, a, b, 0)
			dct, _ := b.dct(55)
			dci := a.dci(2 * time.Millisecond)
			copy(a.mem[100:], "written by a")
			copy(b.mem[8192:], "first secret")
			a.dev.SyncMemory()
			b.dev.SyncMemory()
			for _, tgt := range []*verbs.DCTarget{nil, target(b, dct, 55)} {
				q := qa
				if tgt != nil {
					q = dci
				}
				post(t, q,
					verbs.SendWR{Op: verbs.OpWrite, Local: sge(a, 100, 12), RemoteAddr: 200, RKey: b.mr.RKey(), Target: tgt},
					verbs.SendWR{Op: verbs.OpRead, Local: sge(a, 4096, 12), RemoteAddr: 8192, RKey: b.mr.RKey(), Target: tgt},
					verbs.SendWR{Op: verbs.OpFetchAdd, Flags: verbs.Signaled, Local: sge(a, 64, 8), RemoteAddr: 512, RKey: b.mr.RKey(), CompareAdd: 1, Target: tgt})
				if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
					t.Fatal(wc.Err())
				}
			}
			b.dev.SyncMemory()
			if got := binary.LittleEndian.Uint64(b.mem[512:]); got != 2 {
				t.Fatalf("FETCH_ADD counter %d before replay, want 2", got)
			}
			pkts := capt.take()
			ops := map[wire.Opcode]int{}
			for _, p := range pkts {
				if p.from == a.dev.Addr() {
					ops[p.op]++
				}
			}
			for _, op := range []wire.Opcode{wire.OpCMReq, wire.OpWrite, wire.OpReadReq, wire.OpFetchAdd, wire.OpHSInit} {
				if ops[op] == 0 {
					t.Fatalf("nothing captured of %v: %v", op, ops)
				}
			}
			// After the capture, b's memory changes; a replay must not rewind
			// it, bump the counter, or read the new secret.
			copy(b.mem[200:], "changed by b")
			copy(b.mem[8192:], "later secret")
			b.dev.SyncMemory()
			before := b.dev.AuthStats()
			badBefore := b.dev.Stats().BadMAC
			for _, from := range []netip.AddrPort{outsider.LocalAddr(), a.dev.Addr()} {
				for _, p := range pkts {
					if p.from == a.dev.Addr() && p.to == b.dev.Addr() {
						fb.net.Inject(from, b.dev.Addr(), p.raw)
					}
				}
			}
			fb.net.Flush()
			b.dev.SyncMemory()
			if got := binary.LittleEndian.Uint64(b.mem[512:]); got != 2 {
				t.Fatalf("replayed FETCH_ADD executed: counter %d, want 2", got)
			}
			if string(b.mem[200:212]) != "changed by b" {
				t.Fatalf("replayed WRITE rewound memory: %q", b.mem[200:212])
			}
			seen.Lock()
			for _, d := range toOutsider {
				if bytes.Contains(d, []byte("later secret")) || bytes.Contains(d, []byte("first secret")) {
					t.Fatal("the outsider received memory contents")
				}
			}
			seen.Unlock()
			after := b.dev.AuthStats()
			if after.WrongSource == before.WrongSource || after.Replayed == before.Replayed || after.StaleInit == before.StaleInit {
				t.Fatalf("replays not counted: before %+v after %+v", before, after)
			}
			if b.dev.Stats().BadMAC == badBefore {
				t.Fatal("replays not in BadMAC")
			}
			// The members still work after the replays.
			post(t, qa, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Signaled, Local: sge(a, 4096, 12), RemoteAddr: 8192, RKey: b.mr.RKey()})
			if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
				t.Fatal(wc.Err())
			}
			a.dev.SyncMemory()
			if string(a.mem[4096:4108]) != "later secret" {
				t.Fatalf("member READ after replays: %q", a.mem[4096:4108])
			}
			if enc {
				for _, p := range pkts {
					if bytes.Contains(p.raw, []byte("first secret")) || bytes.Contains(p.raw, []byte("written by a")) {
						t.Fatal("plaintext payload on the wire with Encrypt")
					}
				}
			}
		})
	}
}

// TestRekeyAfterPeerRestart: a peer that restarts (same address, new
// device, no session state) is reached again: its first refusal makes it
// start a handshake, and the requester's retransmission goes through.
func TestRekeyAfterPeerRestart(t *testing.T) {
	fb := newFabric(t, "fake", faults{})
	key := []byte("cluster secret 16+")
	a := fb.keyedNode(key)
	bl := fb.net.NewLink()
	addr := bl.LocalAddr()
	open := func(l *softnictest.Link) *node {
		fb.open = func() link.Link { return l }
		defer func() { fb.open = nil }()
		return fb.keyedNode(key)
	}
	b := open(bl)
	dct, _ := b.dct(7)
	dci := a.dci(5 * time.Millisecond)
	post(t, dci, verbs.SendWR{Op: verbs.OpFetchAdd, Flags: verbs.Signaled, Local: sge(a, 0, 8), RemoteAddr: 0, RKey: b.mr.RKey(), CompareAdd: 1, Target: target(b, dct, 7)})
	if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	b.dev.Close()
	bl2, err := fb.net.NewLinkAt(addr)
	if err != nil {
		t.Fatal(err)
	}
	b2 := open(bl2)
	dct2, _ := b2.dct(7)
	post(t, dci, verbs.SendWR{Op: verbs.OpFetchAdd, Flags: verbs.Signaled, Local: sge(a, 0, 8), RemoteAddr: 0, RKey: b2.mr.RKey(), CompareAdd: 5, Target: target(b2, dct2, 7)})
	if wc := poll(t, a.cq, 1, 5*time.Second)[0]; wc.Err() != nil {
		t.Fatalf("after the peer restarted: %v", wc.Err())
	}
	b2.dev.SyncMemory()
	if got := binary.LittleEndian.Uint64(b2.mem[0:]); got != 5 {
		t.Fatalf("restarted peer's counter %d, want 5", got)
	}
	if a.dev.AuthStats().Handshakes < 2 {
		t.Fatalf("no new session after the restart: %+v", a.dev.AuthStats())
	}
}

// recvFunc is a link.Receiver that hands every packet to a function.
type recvFunc func(from netip.AddrPort, hdr, payload []byte)

func (recvFunc) RxLock()                                       {}
func (recvFunc) RxUnlock()                                     {}
func (recvFunc) Steer(netip.AddrPort, []byte, int, int) []byte { return nil }
func (f recvFunc) Deliver(from netip.AddrPort, hdr, payload []byte) {
	f(from, hdr, payload)
}

// TestEncryptMustMatch: Encrypt needs a key, and a device drops packets
// whose encryption differs from its own setting (counted), so a
// misconfigured pair fails to connect instead of exchanging clear text.
func TestEncryptMustMatch(t *testing.T) {
	fb := newFabric(t, "fake", faults{})
	if _, err := softnic.Open(softnic.Config{Link: fb.link(), Encrypt: true}); err == nil {
		t.Fatal("Encrypt without a ClusterKey accepted")
	}
	key := []byte("cluster secret 16+")
	a := keyedNodeCfg(fb, softnic.Config{ClusterKey: key, Encrypt: true})
	b := keyedNodeCfg(fb, softnic.Config{ClusterKey: key})
	if err := b.dev.ListenRC(1, func(verbs.ConnRequest) (verbs.QP, []byte, error) { return b.rcQP(), nil, nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := contextWithTimeout(2 * time.Second)
	defer cancel()
	if _, err := a.dev.ConnectRC(ctx, a.rcQP(), b.dev.Addr(), 1, verbs.ConnParams{}); err == nil {
		t.Fatal("an encrypting and a clear device connected")
	}
	if b.dev.AuthStats().BadTag == 0 {
		t.Fatalf("mismatched packets not counted: %+v", b.dev.AuthStats())
	}
}
