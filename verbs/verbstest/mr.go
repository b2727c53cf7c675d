package verbstest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"

	"github.com/krfs/krfs/verbs"
)

func ctxDeadline() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), Deadline)
}

var mrCases = []namedCase{
	{"RegisterRefusesBadInput", func(e *env) {
		n := e.node()
		if _, err := n.pd.RegMR(nil, verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrLength) {
			e.t.Fatalf("RegMR(empty): %v, want ErrLength", err)
		}
		if _, err := n.pd.RegMR(make([]byte, 64), verbs.AccessRemoteWrite); !errors.Is(err, verbs.ErrInvalidArg) {
			e.t.Fatalf("RegMR(remote write without local write): %v, want ErrInvalidArg", err)
		}
		if _, err := n.pd.RegMR(make([]byte, 64), verbs.AccessRemoteAtomic); !errors.Is(err, verbs.ErrInvalidArg) {
			e.t.Fatalf("RegMR(remote atomic without local write): %v, want ErrInvalidArg", err)
		}
		mr, err := n.pd.RegMR(make([]byte, 64), verbs.AccessRemoteRead)
		e.ok(err, "RegMR")
		if mr.Access() != verbs.AccessRemoteRead || len(mr.Buf()) != 64 || mr.PD() != n.pd {
			e.t.Fatalf("MR reports access %v, %d bytes, PD %v", mr.Access(), len(mr.Buf()), mr.PD())
		}
		e.ok(mr.Dereg(), "Dereg")
		if err := mr.Dereg(); !errors.Is(err, verbs.ErrMRDead) {
			e.t.Fatalf("second Dereg: %v, want ErrMRDead", err)
		}
	}},
	{"IOVAIsPageOffset", func(e *env) {
		// An MR over a sub-slice that starts 100 bytes into a page is
		// registered at IOVA 100, as the kernel requires (address and
		// IOVA agree within the page): remote address IOVA is the
		// sub-slice's first byte, address 0 is outside the MR, and the MR
		// ends where the sub-slice ends.
		a, b := e.node(), e.node()
		qa, _ := e.connect(a, b, nil)
		big := verbs.PageAligned(3 * verbs.PageSize)
		fill(big, 11)
		orig := bytes.Clone(big)
		b.sync()
		sub := big[verbs.PageSize+100 : 2*verbs.PageSize]
		mr, err := b.pd.RegMR(sub, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
		e.ok(err, "RegMR(sub-slice)")
		if mr.IOVA() != 100 || verbs.PageOffset(sub) != 100 {
			e.t.Fatalf("an MR 100 bytes into a page has IOVA %d", mr.IOVA())
		}
		base := mr.IOVA()
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 16), RemoteAddr: base, RKey: mr.RKey()})
		e.one(a.cq, 1, verbs.StatusSuccess)
		if !bytes.Equal(a.mem[:16], sub[:16]) {
			e.t.Fatalf("READ at the IOVA got % x, want % x", a.mem[:16], sub[:16])
		}
		last := uint64(len(sub) - 8)
		copy(a.mem[64:72], "lastword")
		e.post(qa, verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(64, 8), RemoteAddr: base + last, RKey: mr.RKey()})
		e.one(a.cq, 2, verbs.StatusSuccess)
		b.sync()
		if string(sub[last:]) != "lastword" || big[2*verbs.PageSize] != orig[2*verbs.PageSize] {
			e.t.Fatal("WRITE to the MR's last 8 bytes missed or spilled past them")
		}
		// One byte past the end is out of bounds.
		e.post(qa, verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(64, 8), RemoteAddr: base + last + 1, RKey: mr.RKey()})
		wc := e.one(a.cq, 3, verbs.StatusRemAccessErr)
		e.reason(wc, verbs.ReasonBounds)
		e.state(qa, verbs.StateErr)
		// Address 0 (a zero-based reading of the MR) is before its
		// first byte.
		qa, _ = e.connect(a, b, nil)
		e.post(qa, verbs.SendWR{ID: 4, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 16), RemoteAddr: 0, RKey: mr.RKey()})
		wc = e.one(a.cq, 4, verbs.StatusRemAccessErr)
		e.reason(wc, verbs.ReasonBounds)
		// A sub-slice that starts on a page boundary is zero-based.
		zb, err := b.pd.RegMR(big[verbs.PageSize:2*verbs.PageSize], verbs.AccessLocalWrite|verbs.AccessRemoteRead)
		e.ok(err, "RegMR(page-aligned sub-slice)")
		if zb.IOVA() != 0 {
			e.t.Fatalf("a page-aligned MR has IOVA %d, want 0", zb.IOVA())
		}
		qa, _ = e.connect(a, b, nil)
		e.post(qa, verbs.SendWR{ID: 5, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 16), RemoteAddr: 100, RKey: zb.RKey()})
		e.one(a.cq, 5, verbs.StatusSuccess)
		if !bytes.Equal(a.mem[:16], sub[:16]) {
			e.t.Fatalf("READ at offset 100 of the zero-based MR got % x, want % x", a.mem[:16], sub[:16])
		}
	}},
	{"TwoViewsOfOneBuffer", func(e *env) {
		// meta's table: a read-only rkey for clients, a writable one for
		// itself, over the same memory.
		a, b := e.node(), e.node()
		qa, _ := e.connect(a, b, nil)
		buf := verbs.PageAligned(4096) // zero-based: addressed by offsets
		ro, err := b.pd.RegMR(buf, verbs.AccessRemoteRead)
		e.ok(err, "RegMR(read-only)")
		rw, err := b.pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
		e.ok(err, "RegMR(read-write)")
		copy(a.mem[:5], "table")
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 5), RemoteAddr: 10, RKey: rw.RKey()})
		e.one(a.cq, 1, verbs.StatusSuccess)
		e.post(qa, verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(100, 5), RemoteAddr: 10, RKey: ro.RKey()})
		e.one(a.cq, 2, verbs.StatusSuccess)
		if string(a.mem[100:105]) != "table" {
			e.t.Fatalf("READ through the read-only view got %q", a.mem[100:105])
		}
		e.post(qa, verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 5), RemoteAddr: 10, RKey: ro.RKey()})
		wc := e.one(a.cq, 3, verbs.StatusRemAccessErr)
		e.reason(wc, verbs.ReasonPerm)
	}},
	{"LocalChecksBeforePosting", func(e *env) {
		a, b := e.node(), e.node()
		other, err := a.dev.AllocPD()
		e.ok(err, "AllocPD")
		foreign, err := other.RegMR(make([]byte, 64), verbs.AccessAll)
		e.ok(err, "RegMR(other PD)")
		dead, err := a.pd.RegMR(make([]byte, 64), verbs.AccessAll)
		e.ok(err, "RegMR")
		e.ok(dead.Dereg(), "Dereg")
		readOnly, err := a.pd.RegMR(make([]byte, 64), verbs.AccessRemoteRead)
		e.ok(err, "RegMR(read-only)")
		qa, _ := e.connect(a, b, nil)
		rk := b.mr.RKey()
		cases := []struct {
			name string
			wr   verbs.SendWR
			want error
		}{
			{"no MR", verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{Length: 8}, RKey: rk}, verbs.ErrNoMR},
			{"deregistered MR", verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: dead, Length: 8}, RKey: rk}, verbs.ErrMRDead},
			{"MR of another PD", verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: foreign, Length: 8}, RKey: rk}, verbs.ErrWrongPD},
			{"SGE past the MR", verbs.SendWR{Op: verbs.OpWrite, Local: a.sge(memSize-4, 8), RKey: rk}, verbs.ErrBounds},
			{"READ into memory without local write", verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: readOnly, Length: 8}, RKey: rk}, verbs.ErrAccess},
			{"zero-length READ", verbs.SendWR{Op: verbs.OpRead, Local: a.sge(0, 0), RKey: rk}, verbs.ErrLength},
			{"misaligned atomic", verbs.SendWR{Op: verbs.OpFetchAdd, Local: a.sge(0, 8), RemoteAddr: 4, RKey: rk}, verbs.ErrAlign},
			{"atomic sink not 8 bytes", verbs.SendWR{Op: verbs.OpCmpSwap, Local: a.sge(0, 4), RKey: rk}, verbs.ErrLength},
			{"inline too long", verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, InlineData: make([]byte, 4096)}, verbs.ErrLength},
			{"receive opcode", verbs.SendWR{Op: verbs.OpRecv, Local: a.sge(0, 8)}, verbs.ErrOpcode},
		}
		for _, c := range cases {
			err := qa.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpWrite, Local: a.sge(0, 8), RKey: rk}, c.wr})
			var pe *verbs.PostError
			if !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, c.want) {
				e.t.Errorf("%s: PostSend error %v, want %v at WR 1", c.name, err, c.want)
			}
		}
		// The good WRs before each bad one were posted: they complete
		// (unsignaled, so a signaled marker tells when).
		e.post(qa, verbs.SendWR{ID: 99, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, 8), RKey: rk})
		e.one(a.cq, 99, verbs.StatusSuccess)
		e.state(qa, verbs.StateRTS)
	}},
	{"DeregisteredRKey", func(e *env) {
		a, b := e.node(), e.node()
		qa, qb := e.connect(a, b, nil)
		mr, err := b.pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite|verbs.AccessRemoteRead)
		e.ok(err, "RegMR")
		rk, base := mr.RKey(), mr.IOVA()
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 8), RemoteAddr: base, RKey: rk})
		e.one(a.cq, 1, verbs.StatusSuccess)
		e.ok(mr.Dereg(), "Dereg")
		e.post(qa, verbs.SendWR{ID: 2, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 8), RemoteAddr: base, RKey: rk})
		wc := e.one(a.cq, 2, verbs.StatusRemAccessErr)
		e.reason(wc, verbs.ReasonRKey)
		e.state(qa, verbs.StateErr)
		_ = qb
	}},
	{"AtomicsOnSubslice", func(e *env) {
		a, b := e.node(), e.node()
		qa, _ := e.connect(a, b, nil)
		sub := b.mem[verbs.PageSize+64 : verbs.PageSize+128]
		binary.LittleEndian.PutUint64(sub[8:], 40)
		b.sync()
		mr, err := b.pd.RegMR(sub, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
		e.ok(err, "RegMR")
		if mr.IOVA() != 64 {
			e.t.Fatalf("an MR 64 bytes into a page has IOVA %d", mr.IOVA())
		}
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpFetchAdd, Flags: verbs.Signaled, Local: a.sge(0, 8), RemoteAddr: mr.IOVA() + 8, RKey: mr.RKey(), CompareAdd: 2})
		e.one(a.cq, 1, verbs.StatusSuccess)
		if got := binary.LittleEndian.Uint64(a.mem[:8]); got != 40 {
			e.t.Fatalf("FETCH_ADD returned %d, want 40", got)
		}
		b.sync()
		if got := binary.LittleEndian.Uint64(sub[8:]); got != 42 {
			e.t.Fatalf("FETCH_ADD left %d, want 42", got)
		}
	}},
}
