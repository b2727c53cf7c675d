package qpcore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// Each bad request fails with its own error and errno, is counted, and
// never reaches a QP.
func TestPrecheckCases(t *testing.T) {
	checkLeaks(t)
	c := newCluster(t)
	a := c.add(1, 0, qpcore.Config{VQPDepth: 4, DCIDepth: 2})
	b := c.add(2, 4096, peerCfg)
	if _, err := b.n.Export("ro", verbs.PageAligned(1024), verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	v := mustConnect(t, a.n, 2)
	buf := make([]byte, 64)
	cases := []struct {
		name  string
		run   func() error
		want  error
		errno syscall.Errno
		count func(qpcore.Stats) uint64
	}{
		{"empty local buffer", func() error { return v.Read(ctx, nil, "mem", 0) },
			qpcore.ErrLocalLength, syscall.EINVAL, func(s qpcore.Stats) uint64 { return s.RejectLocal }},
		{"unknown region", func() error { return v.Read(ctx, buf, "nope", 0) },
			qpcore.ErrNoRegion, syscall.ENOENT, func(s qpcore.Stats) uint64 { return s.RejectNoRegion }},
		{"past the end", func() error { return v.Write(ctx, buf, "mem", 4096-32) },
			qpcore.ErrRemoteBounds, syscall.EFBIG, func(s qpcore.Stats) uint64 { return s.RejectBounds }},
		{"offset overflow", func() error { return v.Read(ctx, buf, "mem", 1<<63) },
			qpcore.ErrRemoteBounds, syscall.EFBIG, func(s qpcore.Stats) uint64 { return s.RejectBounds }},
		{"write to a read-only region", func() error { return v.Write(ctx, buf, "ro", 0) },
			qpcore.ErrRemoteAccess, syscall.EACCES, func(s qpcore.Stats) uint64 { return s.RejectAccess }},
		{"atomic on a read-only region", func() error { _, err := v.FetchAdd(ctx, "ro", 0, 1); return err },
			qpcore.ErrRemoteAccess, syscall.EACCES, func(s qpcore.Stats) uint64 { return s.RejectAccess }},
		{"misaligned atomic", func() error { _, err := v.CompareAndSwap(ctx, "mem", 4, 0, 1); return err },
			qpcore.ErrAlign, syscall.EINVAL, func(s qpcore.Stats) uint64 { return s.RejectAlign }},
		{"unknown opcode", func() error {
			_, err := v.Post(ctx, []qpcore.WR{{Op: qpcore.OpCode(99), Local: buf, Region: "mem"}}, 0)
			return err
		}, qpcore.ErrOpcode, syscall.EOPNOTSUPP, func(s qpcore.Stats) uint64 { return s.RejectOpcode }},
	}
	for _, tc := range cases {
		before := tc.count(a.n.Stats())
		err := tc.run()
		if !errors.Is(err, tc.want) || !errors.Is(err, tc.errno) {
			t.Errorf("%s: got %v, want %v (%v)", tc.name, err, tc.want, tc.errno)
		}
		for _, other := range cases {
			if other.want != tc.want && errors.Is(err, other.want) {
				t.Errorf("%s: error %v also matches %v", tc.name, err, other.want)
			}
		}
		if got := tc.count(a.n.Stats()) - before; got != 1 {
			t.Errorf("%s: counted %d times", tc.name, got)
		}
	}
	// A batch stops at its first bad WR; the WRs before it are posted.
	n, err := v.Post(ctx, []qpcore.WR{
		{ID: 1, Op: qpcore.OpWrite, Local: buf, Region: "mem", Offset: 0},
		{ID: 2, Op: qpcore.OpFetchAdd, Region: "mem", Offset: 3},
		{ID: 3, Op: qpcore.OpWrite, Local: buf, Region: "mem", Offset: 0},
	}, 0)
	var pe *qpcore.PostError
	if n != 1 || !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, qpcore.ErrAlign) {
		t.Fatalf("batch: posted %d, %v", n, err)
	}
	cs := make([]qpcore.Completion, 4)
	if v.Wait(ctx) != nil || v.Poll(cs) != 1 || cs[0].ID != 1 || cs[0].Err != nil {
		t.Fatalf("completion of the good WR: %+v", cs[0])
	}
	// Send queue capacity: VQPDepth 4 and DCIs of depth 2. Without
	// blocking, a fifth op is refused (EAGAIN); the DCI never overflows.
	wrs := make([]qpcore.WR, 10)
	for i := range wrs {
		wrs[i] = qpcore.WR{ID: uint64(10 + i), Op: qpcore.OpWrite, Local: buf, Region: "mem", Offset: uint64(i * 64)}
	}
	before := a.n.Stats().RejectWouldBlock
	n, err = v.Post(ctx, wrs, qpcore.NoBlock)
	if n != 4 || !errors.Is(err, qpcore.ErrWouldBlock) || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("NoBlock post: %d %v", n, err)
	}
	if a.n.Stats().RejectWouldBlock != before+1 {
		t.Errorf("would-block not counted")
	}
	// Blocking, the rest go in as completions are polled.
	done := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for done < 10 {
			if v.Wait(ctx) != nil {
				return
			}
			done += v.Poll(cs)
		}
	}()
	if n, err := v.Post(ctx, wrs[4:], 0); n != 6 || err != nil {
		t.Fatalf("blocking post: %d %v", n, err)
	}
	wg.Wait()
	if done != 10 {
		t.Fatalf("%d completions", done)
	}
	s := a.n.Stats()
	t.Logf("rejects %d (local %d region %d bounds %d access %d align %d opcode %d wouldblock %d), QP errors %d",
		s.Rejects(), s.RejectLocal, s.RejectNoRegion, s.RejectBounds, s.RejectAccess, s.RejectAlign, s.RejectOpcode, s.RejectWouldBlock, s.QPErrors)
	noQPErrors(t, a.n)
	for _, q := range a.dev.QPs() {
		if q.State == verbs.StateErr || q.Stats.Errors != 0 {
			t.Errorf("QP %d: state %v, %d errors", q.QPN, q.State, q.Stats.Errors)
		}
	}
}

// A region deregistered between the pre-check and execution makes a
// shared QP fail: a DCI, or the peer's RC QP once it is hot. Only the
// owner of the bad WR sees an error; a VQP streaming to the same peer on
// the same QP (its WRs flushed and posted again) and a VQP to another peer
// see none.
func TestIsolationOnSharedQP(t *testing.T) {
	t.Run("DCI", func(t *testing.T) { testIsolation(t, false) })
	t.Run("RC", func(t *testing.T) { testIsolation(t, true) })
}

func testIsolation(t *testing.T, rc bool) {
	checkLeaks(t)
	c := newCluster(t)
	cfg := qpcore.Config{DCIs: 2, DisableRC: true}
	if rc {
		cfg = qpcore.Config{DCIs: 2, RCThreshold: 50, RCWindow: 50 * time.Millisecond, RCIdle: 10 * time.Second}
	}
	a := c.add(1, 0, cfg)
	b := c.add(2, 1<<20, peerCfg)
	c.add(3, 1<<20, peerCfg)
	ctx := ctxT(t, 30*time.Second)
	const rounds = 5
	victims := make([][]byte, rounds)
	for r := range victims {
		victims[r] = verbs.PageAligned(4096)
		if _, err := b.n.Export(fmt.Sprintf("victim%d", r), victims[r], verbs.AccessRemoteWrite); err != nil {
			t.Fatal(err)
		}
	}
	bad := mustConnect(t, a.n, 2)
	if _, err := bad.Regions(ctx); err != nil { // caches the directory
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg, started sync.WaitGroup
	started.Add(2)
	streamErrs := make(chan error, 4)
	var streamed [2]int
	stream := func(k int, gid uint32) {
		defer wg.Done()
		v, err := a.n.Connect(ctx, gid)
		if err != nil {
			streamErrs <- err
			return
		}
		defer v.Close()
		pl := &pipeline{t: t, v: v, ctx: ctx, cs: make([]qpcore.Completion, 32)}
		rd := make([]byte, 8*64)
		wr := make([]byte, 8*64)
		pl.check = func(c qpcore.Completion) error {
			if c.Err != nil {
				return fmt.Errorf("stream to %d: WR %d: %w", gid, c.ID, c.Err)
			}
			if c.ID&1 == 1 {
				i := c.ID >> 1
				if got := binary.LittleEndian.Uint64(rd[(i%64)*8:]); got != i {
					return fmt.Errorf("stream to %d: read %d saw %d", gid, i, got)
				}
			}
			return nil
		}
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				pl.drain()
				streamed[k] = pl.done
				if pl.err != nil {
					streamErrs <- pl.err
				}
				return
			default:
			}
			s := i % 64
			binary.LittleEndian.PutUint64(wr[s*8:], i)
			pl.post(qpcore.WR{ID: i << 1, Op: qpcore.OpWrite, Local: wr[s*8 : s*8+8], Region: "mem", Offset: 8192 + s*8},
				qpcore.WR{ID: i<<1 | 1, Op: qpcore.OpRead, Local: rd[s*8 : s*8+8], Region: "mem", Offset: 8192 + s*8})
			if s == 63 {
				pl.drain()
				if i == 63 {
					started.Done()
				}
			}
		}
	}
	wg.Add(2)
	go stream(0, 2) // shares the DCI with the bad VQP
	go stream(1, 3) // another peer
	started.Wait()  // both streams completed their first 64 pairs
	if rc {
		eventually(t, "peer 2 on RC", func() bool {
			st, _ := a.n.Peer(2)
			return st.Transport == qpcore.RC
		})
		// The bad VQP joins the RC QP with a harmless operation.
		for bad.Transport() != qpcore.RC {
			if err := bad.Write(ctx, []byte("fine"), "mem", 1<<19); err != nil {
				t.Fatal(err)
			}
		}
	}
	for r := range rounds {
		name := fmt.Sprintf("victim%d", r)
		if err := b.n.Unexport(name); err != nil {
			t.Fatal(err)
		}
		// The client's directory still lists the region: the pre-check
		// passes and the WRITE meets a deregistered rkey at the peer. The
		// WRITE and READ behind it on the same QP are flushed with it:
		// innocents, posted again, they succeed.
		good := []byte(fmt.Sprintf("good %d", r))
		back := make([]byte, len(good))
		if n, err := bad.Post(ctx, []qpcore.WR{
			{ID: 1, Op: qpcore.OpWrite, Local: []byte("boom"), Region: name},
			{ID: 2, Op: qpcore.OpWrite, Local: good, Region: "mem", Offset: 1 << 19},
			{ID: 3, Op: qpcore.OpRead, Local: back, Region: "mem", Offset: 1 << 19},
		}, 0); n != 3 || err != nil {
			t.Fatalf("round %d: post: %d %v", r, n, err)
		}
		var cs []qpcore.Completion
		for len(cs) < 3 {
			if err := bad.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			buf := make([]qpcore.Completion, 3)
			cs = append(cs, buf[:bad.Poll(buf)]...)
		}
		err := cs[0].Err
		var re *qpcore.RemoteError
		if cs[0].ID != 1 || !errors.As(err, &re) || re.Reason != verbs.ReasonRKey || !errors.Is(err, syscall.EIO) {
			t.Fatalf("round %d: bad write returned %v, want a remote access error (invalid rkey)", r, err)
		}
		if cs[1].Err != nil || cs[2].Err != nil || !bytes.Equal(back, good) {
			t.Fatalf("round %d: the bad VQP's innocent WRs: %v, %v, read %q", r, cs[1].Err, cs[2].Err, back)
		}
		// The directory was invalidated by the NAK: the same mistake is
		// now caught by the pre-check.
		if err := bad.Write(ctx, []byte("boom"), name, 0); !errors.Is(err, qpcore.ErrNoRegion) {
			t.Fatalf("round %d: second bad write: %v", r, err)
		}
		settle() // the streams run between rounds
		if rc {
			break // an RC QP in ERR is dropped: the peer is back on DC for RCIdle
		}
	}
	close(stop)
	wg.Wait()
	close(streamErrs)
	for err := range streamErrs {
		t.Error(err)
	}
	s := a.n.Stats()
	t.Logf("streamed %v ops; QP errors %d, DCI recoveries %d, RC errors %d, reposted %d, remote errors %d",
		streamed, s.QPErrors, s.DCIRecoveries, s.RCErrors, s.Reposted, s.RemoteErrors)
	want := uint64(rounds)
	if rc {
		want = 1
		if s.RCErrors != 1 || s.RCFallbacks < 1 {
			t.Fatalf("want the RC QP dropped once: %+v", s)
		}
	} else if s.DCIRecoveries != want {
		t.Fatalf("want %d DCI recoveries: %+v", want, s)
	}
	if s.QPErrors != want || s.RemoteErrors != want {
		t.Fatalf("want %d QP errors and remote errors: %+v", want, s)
	}
	if s.Reposted < 2*want {
		t.Errorf("%d innocent WRs posted again, want at least %d", s.Reposted, 2*want)
	}
	if streamed[0] == 0 || streamed[1] == 0 {
		t.Fatalf("streams did nothing: %v", streamed)
	}
	for _, q := range a.dev.QPs() {
		if q.State == verbs.StateErr {
			t.Errorf("QP %d left in ERR", q.QPN)
		}
	}
	// b's memory is intact where the streams wrote.
	b.dev.SyncMemory()
	if bytes.Contains(b.mem, []byte("boom")) {
		t.Fatal("a refused write landed")
	}
}
