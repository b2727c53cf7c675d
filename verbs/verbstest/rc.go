package verbstest

import (
	"bytes"
	"encoding/binary"

	"github.com/krfs/krfs/verbs"
)

// opsOver runs the one-sided and two-sided operations every transport
// must carry: send posts on the requester, rq is where the responder's
// receives go, a and b are requester and responder nodes.
func opsOver(e *env, a, b *node, send func(...verbs.SendWR), rq interface{ PostRecv([]verbs.RecvWR) error }, srcQPN uint32, srcKnown bool) {
	rk := b.mr.RKey()
	sizes := []uint32{1, 4095, 4096, 4097, 200_000}

	// WRITE then READ back, one to many packets.
	for i, size := range sizes {
		src := a.mem[:size]
		fill(src, byte(i+1))
		id := uint64(100 + i)
		send(verbs.SendWR{ID: id, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: a.sge(0, size), RemoteAddr: 300_000, RKey: rk})
		e.one(a.cq, id, verbs.StatusSuccess)
		b.sync()
		if !bytes.Equal(b.mem[300_000:300_000+size], src) {
			e.t.Fatalf("WRITE of %d bytes: remote memory differs", size)
		}
		fill(b.mem[600_000:600_000+size], byte(i+50))
		b.sync()
		send(verbs.SendWR{ID: id + 50, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, size), RemoteAddr: 600_000, RKey: rk})
		wc := e.one(a.cq, id+50, verbs.StatusSuccess)
		if wc.Op != verbs.OpRead {
			e.t.Fatalf("READ completion has opcode %v", wc.Op)
		}
		if !bytes.Equal(a.mem[:size], b.mem[600_000:600_000+size]) {
			e.t.Fatalf("READ of %d bytes: local memory differs", size)
		}
	}

	// SEND and SEND_WITH_IMM into posted receives; Inline SEND.
	e.recv(rq, verbs.RecvWR{ID: 1, Local: b.sge(0, 8192)}, verbs.RecvWR{ID: 2, Local: b.sge(8192, 8192)},
		verbs.RecvWR{ID: 3, Local: b.sge(16384, 64)})
	copy(a.mem[:5000], bytes.Repeat([]byte("send!"), 1000))
	send(verbs.SendWR{ID: 10, Op: verbs.OpSend, Flags: verbs.Signaled, Local: a.sge(0, 5000)},
		verbs.SendWR{ID: 11, Op: verbs.OpSendImm, Flags: verbs.Signaled, Local: a.sge(0, 7), Imm: 0xfeed},
		verbs.SendWR{ID: 12, Op: verbs.OpSend, Flags: verbs.Signaled | verbs.Inline, InlineData: []byte("inline")})
	got := map[uint64]verbs.WC{}
	for _, wc := range e.wcs(a.cq, 3) {
		got[wc.ID] = wc
	}
	for _, wc := range e.wcs(b.cq, 3) {
		got[wc.ID] = wc
	}
	for id, want := range map[uint64]verbs.Opcode{10: verbs.OpSend, 11: verbs.OpSendImm, 12: verbs.OpSend, 1: verbs.OpRecv, 2: verbs.OpRecv, 3: verbs.OpRecv} {
		wc, ok := got[id]
		if !ok || wc.Status != verbs.StatusSuccess || wc.Op != want {
			e.t.Fatalf("WR %d: completion %+v, want a successful %v", id, wc, want)
		}
	}
	if r := got[1]; r.ByteLen != 5000 || r.HasImm || r.SrcQPN != srcQPN || (srcKnown && r.SrcAddr != a.dev.Addr()) {
		e.t.Fatalf("first receive %+v: want 5000 bytes without immediate from QP %d at %v", r, srcQPN, a.dev.Addr())
	}
	if r := got[2]; r.ByteLen != 7 || !r.HasImm || r.Imm != 0xfeed {
		e.t.Fatalf("second receive %+v: want 7 bytes with immediate 0xfeed", r)
	}
	if r := got[3]; r.ByteLen != 6 {
		e.t.Fatalf("inline receive %+v: want 6 bytes", r)
	}
	if !bytes.Equal(b.mem[:5000], a.mem[:5000]) || string(b.mem[16384:16390]) != "inline" {
		e.t.Fatal("received payloads differ from what was sent")
	}

	// WRITE_WITH_IMM consumes a receive without touching its buffer;
	// Inline WRITE.
	e.recv(rq, verbs.RecvWR{ID: 4, Local: b.sge(20000, 16)})
	copy(a.mem[:3], "imm")
	send(verbs.SendWR{ID: 20, Op: verbs.OpWriteImm, Flags: verbs.Signaled, Local: a.sge(0, 3), RemoteAddr: 700_000, RKey: rk, Imm: 77},
		verbs.SendWR{ID: 21, Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Inline, InlineData: []byte("inl"), RemoteAddr: 700_010, RKey: rk})
	e.wcs(a.cq, 2)
	r := e.one(b.cq, 4, verbs.StatusSuccess)
	if r.Op != verbs.OpRecvWriteImm || !r.HasImm || r.Imm != 77 || r.ByteLen != 3 {
		e.t.Fatalf("WRITE_WITH_IMM receive %+v: want RECV_RDMA_WITH_IMM, imm 77, 3 bytes", r)
	}
	b.sync()
	if string(b.mem[700_000:700_003]) != "imm" || string(b.mem[700_010:700_013]) != "inl" {
		e.t.Fatal("WRITE_WITH_IMM or inline WRITE payload missing")
	}

	// Atomics return the original value.
	binary.LittleEndian.PutUint64(b.mem[800_000:], 5)
	b.sync()
	send(verbs.SendWR{ID: 30, Op: verbs.OpCmpSwap, Flags: verbs.Signaled, Local: a.sge(0, 8), RemoteAddr: 800_000, RKey: rk, CompareAdd: 5, Swap: 9},
		verbs.SendWR{ID: 31, Op: verbs.OpCmpSwap, Flags: verbs.Signaled, Local: a.sge(8, 8), RemoteAddr: 800_000, RKey: rk, CompareAdd: 5, Swap: 1},
		verbs.SendWR{ID: 32, Op: verbs.OpFetchAdd, Flags: verbs.Signaled, Local: a.sge(16, 8), RemoteAddr: 800_000, RKey: rk, CompareAdd: 100})
	for _, wc := range e.wcs(a.cq, 3) {
		if wc.Status != verbs.StatusSuccess {
			e.t.Fatalf("atomic: %v", wc.Err())
		}
	}
	b.sync()
	if o1, o2, o3, now := binary.LittleEndian.Uint64(a.mem[0:]), binary.LittleEndian.Uint64(a.mem[8:]),
		binary.LittleEndian.Uint64(a.mem[16:]), binary.LittleEndian.Uint64(b.mem[800_000:]); o1 != 5 || o2 != 9 || o3 != 9 || now != 109 {
		e.t.Fatalf("atomics returned %d, %d, %d and left %d; want 5, 9, 9 and 109", o1, o2, o3, now)
	}

	// A batch of unsignaled READs ended by a signaled one: one
	// completion, and every READ landed.
	fill(b.mem[900_000:900_000+64*100], 99)
	b.sync()
	var batch []verbs.SendWR
	for i := range 64 {
		batch = append(batch, verbs.SendWR{ID: uint64(1000 + i), Op: verbs.OpRead, Local: a.sge(uint64(i*100), 100),
			RemoteAddr: uint64(900_000 + i*100), RKey: rk})
	}
	batch[63].Flags = verbs.Signaled
	send(batch...)
	e.one(a.cq, 1063, verbs.StatusSuccess)
	if !bytes.Equal(a.mem[:6400], b.mem[900_000:906_400]) {
		e.t.Fatal("unsignaled READs of a batch did not all land")
	}
	a.sync() // the caller's next case WRITEs into what was just read
	e.quiet(a.cq)
}

var rcCases = []namedCase{
	{"Operations", func(e *env) {
		a, b := e.node(), e.node()
		qa, qb := e.connect(a, b, nil)
		opsOver(e, a, b, func(wrs ...verbs.SendWR) { e.post(qa, wrs...) }, qb, qa.QPN(), true)
		// The connection is symmetric: the passive side posts too.
		copy(b.mem[:4], "back")
		b.sync()
		e.post(qb, verbs.SendWR{ID: 5, Op: verbs.OpWrite, Flags: verbs.Signaled, Local: b.sge(0, 4), RemoteAddr: 50, RKey: a.mr.RKey()})
		e.one(b.cq, 5, verbs.StatusSuccess)
		a.sync()
		if string(a.mem[50:54]) != "back" {
			e.t.Fatal("WRITE from the passive side did not land")
		}
		if info := qa.Info(); info.State != verbs.StateRTS || info.RemoteQPN != qb.QPN() || info.Remote != b.dev.Addr() {
			e.t.Fatalf("Info %+v: want RTS connected to QP %d at %v", info, qb.QPN(), b.dev.Addr())
		}
	}},
	{"Fence", func(e *env) {
		// A fenced WRITE waits for the READ before it: the READ sees the
		// old bytes.
		a, b := e.node(), e.node()
		qa, _ := e.connect(a, b, nil)
		copy(b.mem[:3], "old")
		b.sync()
		copy(a.mem[100:103], "new")
		e.post(qa, verbs.SendWR{ID: 1, Op: verbs.OpRead, Flags: verbs.Signaled, Local: a.sge(0, 3), RKey: b.mr.RKey()},
			verbs.SendWR{ID: 2, Op: verbs.OpWrite, Flags: verbs.Signaled | verbs.Fence, Local: a.sge(100, 3), RKey: b.mr.RKey()})
		e.wcs(a.cq, 2)
		b.sync()
		if string(a.mem[:3]) != "old" || string(b.mem[:3]) != "new" {
			e.t.Fatalf("READ got %q and memory holds %q; want old, new", a.mem[:3], b.mem[:3])
		}
	}},
	{"SendNeedsReceiveBufferLargeEnough", func(e *env) {
		a, b := e.node(), e.node()
		qa, qb := e.connect(a, b, nil)
		e.recv(qb, verbs.RecvWR{ID: 1, Local: b.sge(0, 16)})
		e.post(qa, verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled, Local: a.sge(0, 17)})
		var req, resp verbs.WC
		for _, wc := range e.wcs(a.cq, 1) {
			req = wc
		}
		for _, wc := range e.wcs(b.cq, 1) {
			resp = wc
		}
		if req.ID != 2 || req.Status == verbs.StatusSuccess {
			e.t.Fatalf("SEND into a short buffer completed %+v, want an error", req)
		}
		if resp.ID != 1 || resp.Status != verbs.StatusLocLenErr {
			e.t.Fatalf("short receive completed %+v, want local length error", resp)
		}
		e.reason(req, verbs.ReasonRecvLen)
	}},
}
