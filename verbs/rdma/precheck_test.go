package rdma

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/krfs/krfs/verbs"
)

// fakeMR is an MR as the pre-check sees it, without a device.
type fakeMR struct{ st mrState }

func (m *fakeMR) state() *mrState      { return &m.st }
func (m *fakeMR) Buf() []byte          { return m.st.buf }
func (m *fakeMR) IOVA() uint64         { return m.st.iova }
func (m *fakeMR) LKey() uint32         { return m.st.lkey }
func (m *fakeMR) RKey() uint32         { return m.st.rkey }
func (m *fakeMR) Access() verbs.Access { return m.st.access }
func (m *fakeMR) PD() verbs.PD         { return nil }
func (m *fakeMR) Dereg() error         { m.st.dead.Store(true); return nil }

type otherMR struct{ fakeMR }

// state, with another signature, hides fakeMR's: otherMR is no mrStater,
// like an MR of another backend.
//
//lint:ignore U1000 present for its effect on the method set
func (*otherMR) state() {}

func TestCheckSend(t *testing.T) {
	pd, otherPD := new(int), new(int)
	mk := func(size int, a verbs.Access, p any) *fakeMR {
		return &fakeMR{st: mrState{buf: make([]byte, size), access: a, pd: p, lkey: 1, rkey: 2}}
	}
	rw, ro, foreign, dead := mk(64, verbs.AccessAll, pd), mk(64, verbs.AccessRemoteRead, pd), mk(64, verbs.AccessAll, otherPD), mk(64, verbs.AccessAll, pd)
	dead.Dereg()
	caps := verbs.QPCaps{MaxInline: 32}
	tgt := &verbs.DCTarget{DCTN: 1}
	cases := []struct {
		name string
		typ  verbs.QPType
		wr   verbs.SendWR
		want error
	}{
		{"READ", verbs.RC, verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: rw, Length: 64}}, nil},
		{"WRITE from read-only memory", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: ro, Length: 8}}, nil},
		{"READ into read-only memory", verbs.RC, verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: ro, Length: 8}}, verbs.ErrAccess},
		{"no MR", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{Length: 8}}, verbs.ErrNoMR},
		{"MR of another backend", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: &otherMR{}, Length: 8}}, verbs.ErrNoMR},
		{"dead MR", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: dead, Length: 8}}, verbs.ErrMRDead},
		{"other PD", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: foreign, Length: 8}}, verbs.ErrWrongPD},
		{"past the end", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: rw, Offset: 60, Length: 8}}, verbs.ErrBounds},
		{"offset overflow", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: rw, Offset: 1<<64 - 4, Length: 8}}, verbs.ErrBounds},
		{"zero length", verbs.RC, verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: rw}}, verbs.ErrLength},
		{"empty SEND", verbs.RC, verbs.SendWR{Op: verbs.OpSend}, nil},
		{"inline", verbs.RC, verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, InlineData: make([]byte, 32)}, nil},
		{"inline too long", verbs.RC, verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, InlineData: make([]byte, 33)}, verbs.ErrLength},
		{"empty inline WRITE", verbs.RC, verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.Inline}, verbs.ErrLength},
		{"inline READ", verbs.RC, verbs.SendWR{Op: verbs.OpRead, Flags: verbs.Inline, Local: verbs.SGE{MR: rw, Length: 8}}, verbs.ErrInvalidArg},
		{"atomic", verbs.RC, verbs.SendWR{Op: verbs.OpFetchAdd, Local: verbs.SGE{MR: rw, Length: 8}, RemoteAddr: 16}, nil},
		{"misaligned atomic", verbs.RC, verbs.SendWR{Op: verbs.OpCmpSwap, Local: verbs.SGE{MR: rw, Length: 8}, RemoteAddr: 4}, verbs.ErrAlign},
		{"atomic sink of 4", verbs.RC, verbs.SendWR{Op: verbs.OpFetchAdd, Local: verbs.SGE{MR: rw, Length: 4}}, verbs.ErrLength},
		{"atomic into read-only", verbs.RC, verbs.SendWR{Op: verbs.OpFetchAdd, Local: verbs.SGE{MR: ro, Length: 8}}, verbs.ErrAccess},
		{"receive opcode", verbs.RC, verbs.SendWR{Op: verbs.OpRecv, Local: verbs.SGE{MR: rw, Length: 8}}, verbs.ErrOpcode},
		{"DCI without target", verbs.DCI, verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: rw, Length: 8}}, verbs.ErrNoTarget},
		{"DCI with target", verbs.DCI, verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: rw, Length: 8}, Target: tgt}, nil},
		{"DCT sends", verbs.DCT, verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: rw, Length: 8}}, verbs.ErrOpcode},
	}
	for _, c := range cases {
		err := checkSend(&c.wr, c.typ, caps, pd, verbs.AtomicHCA)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Without atomics (upstream mlx5's atomic_cap NONE) both atomics are
	// refused before the NIC sees them; everything else is unchanged.
	for _, op := range []verbs.Opcode{verbs.OpCmpSwap, verbs.OpFetchAdd} {
		wr := verbs.SendWR{Op: op, Local: verbs.SGE{MR: rw, Length: 8}, RemoteAddr: 16}
		if err := checkSend(&wr, verbs.RC, caps, pd, verbs.AtomicNone); !errors.Is(err, verbs.ErrNotSupported) {
			t.Errorf("%v without atomics: %v, want ErrNotSupported", op, err)
		}
	}
	if err := checkSend(&verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: rw, Length: 8}}, verbs.RC, caps, pd, verbs.AtomicNone); err != nil {
		t.Errorf("READ without atomics: %v", err)
	}
	if err := checkRecv(&verbs.RecvWR{Local: verbs.SGE{MR: ro, Length: 8}}, pd); !errors.Is(err, verbs.ErrAccess) {
		t.Errorf("receive into read-only memory: %v", err)
	}
	if err := checkRecv(&verbs.RecvWR{Local: verbs.SGE{MR: rw, Length: 8}}, pd); err != nil {
		t.Errorf("receive: %v", err)
	}
}

func TestSendTrack(t *testing.T) {
	tr := newSendTrack(4)
	for i := range 4 {
		if !tr.push(posted{id: uint64(i), op: verbs.OpWrite, signaled: i == 2}) {
			t.Fatalf("push %d refused", i)
		}
	}
	if tr.push(posted{id: 9}) || tr.free() != 0 {
		t.Fatal("a full track accepted a WR")
	}
	// The signaled WR 2 completes: WRs 0 and 1 retire with it.
	if p, ok := tr.complete(2); !ok || p.op != verbs.OpWrite || tr.free() != 3 {
		t.Fatalf("complete(2) = %+v, %v with %d free", p, ok, tr.free())
	}
	if _, ok := tr.complete(0); ok {
		t.Fatal("a retired WR completed again")
	}
	// Wrap around and duplicate IDs: the oldest match completes first.
	dc := netip.MustParseAddrPort("10.0.0.9:4792")
	tr.push(posted{id: 3, op: verbs.OpRead, target: dc})
	tr.push(posted{id: 3, op: verbs.OpSend})
	if p, _ := tr.complete(3); p.op != verbs.OpWrite || tr.free() != 2 {
		t.Fatalf("first completion of id 3: %+v, %d free", p, tr.free())
	}
	// A DCI WR's completion names its target (a retry error invalidates
	// the target's cached address handle).
	if p, _ := tr.complete(3); p.op != verbs.OpRead || p.target != dc {
		t.Fatalf("second completion of id 3: %+v", p)
	}
	tr.reset()
	if tr.free() != 4 {
		t.Fatal("reset left WRs")
	}
}
