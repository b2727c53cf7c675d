package softnic_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/krfs/krfs/verbs"
	"github.com/krfs/krfs/verbs/softnic"
)

// mixedClient drives one requester QP through a random mix of WRITE,
// WRITE_WITH_IMM, READ, FETCH_ADD and SEND against a server node, keeping
// a shadow copy of its own part of the server's memory to check every READ.
type mixedClient struct {
	t      testing.TB
	c, srv *node
	qp     verbs.QP
	target *verbs.DCTarget
	base   uint64 // start of this client's area in the server MR
	area   uint64
	shadow []byte
	rng    *rand.Rand

	faaOld []uint64 // original values returned by FETCH_ADD
	faaSum uint64
	imms   int // WRITE_WITH_IMM and SEND messages sent (each must arrive once)
}

const (
	counterOff = 0    // the shared FETCH_ADD counter in the server MR
	window     = 16   // operations in flight per client
	slotSize   = 8192 // local buffer per in-flight operation
)

type pending struct {
	op   verbs.Opcode
	slot int
	off  uint64 // READ: remote range, to fence WRITEs that overlap it
	n    uint64
	want []byte
	add  uint64
}

func (m *mixedClient) run(ops int) error {
	mtu := m.c.dev.MTU()
	inflight := map[uint64]pending{}
	free := make([]int, window)
	for i := range free {
		free[i] = i
	}
	wcs := make([]verbs.WC, window)
	posted, done := 0, 0
	// A hang guard on progress, not on the run: on a loaded machine (or
	// the manual-clock fabric starved of CPU) 10,000 operations can take
	// minutes, but a completion never stops coming for two.
	deadline := time.Now().Add(stuckAfter)
	for done < ops {
		var batch []verbs.SendWR
		for posted < ops && len(free) > 0 {
			slot := free[len(free)-1]
			free = free[:len(free)-1]
			local := uint64(16 + slot*slotSize) // after the FAA sinks
			id := uint64(posted)
			wr := verbs.SendWR{ID: id, Flags: verbs.Signaled, RKey: m.srv.mr.RKey(), Target: m.target}
			p := pending{slot: slot}
			n := 1 + m.rng.IntN(min(slotSize, 2*mtu+mtu/2))
			off := m.rng.Uint64N(m.area - uint64(n))
			switch r := m.rng.IntN(10); {
			case r < 3: // WRITE
				wr.Op = verbs.OpWrite
				for i := range n {
					m.c.mem[local+uint64(i)] = byte(m.rng.Uint32())
				}
				copy(m.shadow[off:], m.c.mem[local:local+uint64(n)])
			case r < 4: // WRITE_WITH_IMM
				wr.Op, wr.Imm = verbs.OpWriteImm, uint32(m.imms)
				m.imms++
				for i := range n {
					m.c.mem[local+uint64(i)] = byte(m.rng.Uint32())
				}
				copy(m.shadow[off:], m.c.mem[local:local+uint64(n)])
			case r < 8: // READ
				wr.Op = verbs.OpRead
				p.want = append([]byte(nil), m.shadow[off:off+uint64(n)]...)
			case r < 9: // FETCH_ADD on the shared counter
				wr.Op, off, n = verbs.OpFetchAdd, counterOff, 8
				p.add = 1 + m.rng.Uint64N(1000)
				wr.CompareAdd = p.add
				m.faaSum += p.add
			default: // SEND with immediate
				wr.Op, wr.Imm = verbs.OpSendImm, uint32(m.imms)
				m.imms++
				n = 1 + m.rng.IntN(256)
			}
			p.op = wr.Op
			if wr.Op == verbs.OpRead {
				p.off, p.n = off, uint64(n)
			}
			if wr.Op == verbs.OpWrite || wr.Op == verbs.OpWriteImm {
				// As on InfiniBand, a retransmitted READ is executed again
				// and may see later WRITEs; a WRITE that must not change
				// what an earlier READ returns waits behind a fence.
				for _, q := range inflight {
					if q.op == verbs.OpRead && off < q.off+q.n && q.off < off+uint64(n) {
						wr.Flags |= verbs.Fence
						break
					}
				}
			}
			wr.Local = sge(m.c, local, uint32(n))
			wr.RemoteAddr = m.base + off
			if wr.Op == verbs.OpFetchAdd {
				wr.RemoteAddr = counterOff
			}
			inflight[id] = p
			batch = append(batch, wr)
			posted++
		}
		if len(batch) > 0 {
			if err := m.qp.PostSend(batch); err != nil {
				return err
			}
		}
		k := m.c.cq.Poll(wcs)
		if k == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("stuck: %d of %d done, none in %v, QP %+v\n%s", done, ops, stuckAfter, m.qp.Info(), softnic.DebugQP(m.qp))
			}
			select {
			case <-m.c.cq.Notify():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		for _, wc := range wcs[:k] {
			p, ok := inflight[wc.ID]
			if !ok {
				return fmt.Errorf("completion for unknown WR %d", wc.ID)
			}
			delete(inflight, wc.ID)
			if err := wc.Err(); err != nil {
				return m.failure(wc, wcs[:k])
			}
			local := uint64(16 + p.slot*slotSize)
			switch p.op {
			case verbs.OpRead:
				if got := m.c.mem[local : local+uint64(len(p.want))]; !bytes.Equal(got, p.want) {
					first := 0
					for first < len(got) && got[first] == p.want[first] {
						first++
					}
					last := len(got) - 1
					for last > first && got[last] == p.want[last] {
						last--
					}
					where := "nowhere"
					if i := bytes.Index(m.srv.mem, got[first:last+1]); i >= 0 {
						where = fmt.Sprintf("server offset %d (READ was at %d)", i-int(m.base), p.off)
					} else if i := bytes.Index(m.c.mem, got[first:last+1]); i >= 0 {
						where = fmt.Sprintf("client offset %d (slot at %d)", i, local)
					}
					return fmt.Errorf("READ WR %d (%d bytes) returned wrong bytes at [%d, %d], found at %s", wc.ID, len(got), first, last, where)
				}
			case verbs.OpFetchAdd:
				m.faaOld = append(m.faaOld, binary.NativeEndian.Uint64(m.c.mem[local:]))
			}
			free = append(free, p.slot)
			done++
			deadline = time.Now().Add(stuckAfter)
		}
	}
	return nil
}

// failure describes a failed completion wc: a WR flushed because an
// earlier or later one failed says little, so it also names the first
// completion of the failure that was not a flush, and the QP's counters.
func (m *mixedClient) failure(wc verbs.WC, batch []verbs.WC) error {
	cause := "none seen"
	more := make([]verbs.WC, window)
	for i := 0; i < 4 && cause == "none seen"; i++ {
		for _, w := range batch {
			if w.Status != verbs.StatusSuccess && w.Status != verbs.StatusWRFlushErr {
				cause = fmt.Sprintf("WR %d: %v", w.ID, w.Err()) // an error completion has no opcode
				break
			}
		}
		batch = more[:m.c.cq.Poll(more)]
	}
	return fmt.Errorf("%w; cause: %s; QP %+v", wc.Err(), cause, m.qp.Info().Stats)
}

// runMixed runs two clients (one device each) concurrently against one
// server and checks exactly-once effects.
func runMixed(t *testing.T, fb *fabric, dc bool, ops int, timeout time.Duration) {
	srv := fb.node()
	var srq verbs.SRQ
	var dct verbs.QP
	if dc {
		dct, srq = srv.dct(77)
	}
	clients := make([]*mixedClient, 2)
	area := uint64(memSize/4) - 64
	for i := range clients {
		c := fb.node()
		m := &mixedClient{t: t, c: c, srv: srv, base: 64 + uint64(i)*(memSize/2), area: area,
			shadow: make([]byte, area), rng: rand.New(rand.NewPCG(uint64(i), 99))}
		copy(m.shadow, srv.mem[m.base:m.base+area])
		if dc {
			m.qp = c.dci(timeout)
			m.target = target(srv, dct, 77)
		} else {
			var qs verbs.QP
			m.qp, qs = connect(t, c, srv, timeout)
			recvs := make([]verbs.RecvWR, 4096)
			for j := range recvs {
				recvs[j] = verbs.RecvWR{ID: uint64(j), Local: sge(srv, memSize-4096, 4096)}
			}
			if err := qs.PostRecv(recvs); err != nil {
				t.Fatal(err)
			}
		}
		clients[i] = m
	}
	if dc {
		recvs := make([]verbs.RecvWR, 4096)
		for j := range recvs {
			recvs[j] = verbs.RecvWR{ID: uint64(j), Local: sge(srv, memSize-4096, 4096)}
		}
		if err := srq.PostRecv(recvs); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(clients))
	for i, m := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.run(ops)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	srv.dev.SyncMemory()
	// Every WRITE landed (the server memory equals each shadow) ...
	for i, m := range clients {
		if !bytes.Equal(srv.mem[m.base:m.base+m.area], m.shadow) {
			t.Fatalf("client %d: server memory differs from the writes issued", i)
		}
	}
	// ... FETCH_ADD from two QPs ends at exactly the sum, and no add ran
	// twice: every original value is distinct (all addends are positive).
	var sum uint64
	var olds []uint64
	for _, m := range clients {
		sum += m.faaSum
		olds = append(olds, m.faaOld...)
	}
	if got := binary.NativeEndian.Uint64(srv.mem[counterOff:]); got != sum {
		t.Fatalf("counter = %d, want the sum of the adds %d", got, sum)
	}
	sort.Slice(olds, func(i, j int) bool { return olds[i] < olds[j] })
	for i := 1; i < len(olds); i++ {
		if olds[i] == olds[i-1] {
			t.Fatalf("two FETCH_ADDs returned the same original value %d: one executed twice", olds[i])
		}
	}
	// ... and every message with an immediate arrived exactly once, in order
	// per client.
	total := 0
	for _, m := range clients {
		total += m.imms
	}
	rw := poll(t, srv.cq, total, 10*time.Second)
	next := map[uint32]uint32{}
	for _, wc := range rw {
		if wc.Err() != nil {
			t.Fatalf("receive: %v", wc.Err())
		}
		if wc.Imm != next[wc.SrcQPN] {
			t.Fatalf("from QP %d: immediate %d, want %d (lost, duplicated or reordered)", wc.SrcQPN, wc.Imm, next[wc.SrcQPN])
		}
		next[wc.SrcQPN]++
	}
	if extra := srv.cq.Poll(make([]verbs.WC, 8)); extra != 0 {
		t.Fatalf("%d extra receive completions: a message was delivered twice", extra)
	}
	st := srv.dev.Stats()
	t.Logf("%s dc=%v: server retransmits=%d rx=%d; client0 QP %+v", fb.name, dc, st.Retransmits, st.RxPackets, clients[0].qp.Info().Stats)
}

// TestLossyMixed is the reliability acceptance test: 10,000 mixed operations
// with 10% drop, 5% duplication and 5% reordering.
func TestLossyMixed(t *testing.T) {
	ops := 5000 // per client; two clients
	if testing.Short() {
		ops = 1000
	}
	f := faults{drop: 0.10, dup: 0.05, reorder: 0.05}
	for _, dc := range []bool{false, true} {
		t.Run(fmt.Sprintf("dc=%v", dc), func(t *testing.T) {
			// The fake network on manual time: only real losses time
			// out, so a busy machine cannot exhaust the retry counter.
			t.Run("fake", func(t *testing.T) {
				checkLeaks(t)
				fb, stop := newManualFabric(t, f)
				defer stop()
				runMixed(t, fb, dc, ops, lossyTimeout)
			})
			// Real UDP in real time.
			t.Run("udp", func(t *testing.T) {
				checkLeaks(t)
				runMixed(t, newFabric(t, "udp", f), dc, ops, udpLossyTimeout)
			})
		})
	}
}

// TestMixedClean runs the same workload on a perfect network: any failure
// here is a protocol or engine bug, not a reliability one.
func TestMixedClean(t *testing.T) {
	for _, dc := range []bool{false, true} {
		t.Run(fmt.Sprintf("dc=%v", dc), func(t *testing.T) {
			forEachFabric(t, faults{}, func(t *testing.T, fb *fabric) {
				runMixed(t, fb, dc, 2000, patientTimeout)
			})
		})
	}
}

// lossyTimeout is the ACK timeout of the lossy tests: short, so that the
// many tail losses are repaired quickly, but with room for a machine
// busy with other test packages under -race (8 timeouts without progress
// fail a WR).
const lossyTimeout = 6 * time.Millisecond

// udpLossyTimeout is the ACK timeout of the lossy tests over real UDP in
// real time. There a timer that fires while the responder waits for a CPU
// counts against RetryCnt exactly like a loss, and 8 of 6 ms (48 ms of
// starvation, common when other processes load the 2 vCPUs) failed WRs
// with RETRY_EXC_ERR. 50 ms asks for 400 ms of starvation without progress;
// the ~250 tail losses per run that only the timer repairs cost about
// 13 s per variant.
const udpLossyTimeout = 50 * time.Millisecond

// stuckAfter is how long runMixed's clients wait for the next completion
// before they call the run stuck.
const stuckAfter = 2 * time.Minute
