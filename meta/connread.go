package meta

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"time"

	"github.com/krfs/krfs/verbs"
)

// read READs n bytes of the table at off into slot's landing area and
// returns them. The caller holds a reference and the slot (armed opRead).
func (cn *conn) read(ctx context.Context, slot int, seq uint32, off uint64, n int) ([]byte, bool, error) {
	lo := uint64(slot * cn.slotSize)
	wr := verbs.SendWR{ID: wrID(slot, seq), Op: verbs.OpRead, Flags: verbs.Signaled,
		Local: verbs.SGE{MR: cn.mr, Offset: lo, Length: uint32(n)}, RemoteAddr: off, RKey: cn.boot.TableRKey}
	if err := cn.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		cn.kill()
		return nil, cn.abandon(slot, seq), fmt.Errorf("%w: %v: %v", ErrUnreachable, cn.addr, err)
	}
	// Run to completion first (drive.go); the wait then finds it done.
	adapt := true
	rto := cn.ackTimeout()
	if d, done, late := cn.drive(ctx, &cn.ops[slot], rto); done {
		cn.took(d, true)
		adapt = false
	} else if late {
		cn.late(rto)
	}
	abandoned, err := cn.wait(ctx, slot, seq, nil, adapt)
	if err != nil {
		return nil, abandoned, err
	}
	cn.cl.st.reads.Add(1)
	return cn.mem[lo : lo+uint64(n)], false, nil
}

// rearm starts a new op in a slot the caller still owns.
func (cn *conn) rearm(slot int, kind opKind) uint32 {
	cn.pollMu.Lock()
	o := &cn.ops[slot]
	o.seq++
	o.kind, o.finished, o.abandoned, o.err = kind, false, false, nil
	o.wc, o.reply = verbs.WC{}, message{}
	seq := o.seq
	cn.pollMu.Unlock()
	return seq
}

// lookup finds gid with one READ of its neighbourhood, again while the
// READ shows a write in progress where the entry could be. Like every
// operation on a conn, the caller holds a reference.
func (cn *conn) lookup(ctx context.Context, gid uint32) (NodeInfo, bool, error) {
	slot, seq, err := cn.acquire(ctx, opRead)
	if err != nil {
		return NodeInfo{}, false, err
	}
	home := cn.geom.home(gid)
	start := time.Now()
	for try := 0; ; try++ {
		if try > 0 {
			seq = cn.rearm(slot, opRead)
		}
		b, abandoned, err := cn.read(ctx, slot, seq, slotOffset(home), cn.geom.nbhdBytes())
		if err != nil {
			if !abandoned {
				cn.finish(slot)
			}
			return NodeInfo{}, false, err
		}
		n, found, torn := scanNeighbourhood(b, gid)
		if !torn {
			cn.finish(slot)
			return n, found, nil
		}
		cn.cl.st.tornReads.Add(1)
		if tornTooLong(try, start) {
			cn.finish(slot)
			return NodeInfo{}, false, fmt.Errorf("meta: gid %d: entry kept changing over %d READs", gid, try+1)
		}
		backoff(try)
	}
}

// A lookup READs a slot that keeps showing a write in progress again at
// least maxTornRetries times and for at least tornPatience of real time:
// a write group whose WRITE was lost completes only when the server's
// loopback QP resends it, after its ACK timeout (connQPTimeout).
const (
	maxTornRetries = 100
	tornPatience   = 2 * connQPTimeout
)

// tornTooLong reports whether a slot torn try times since start (real
// time, like backoff) is given up on.
func tornTooLong(try int, start time.Time) bool {
	return try >= maxTornRetries && time.Since(start) > tornPatience
}

// backoff waits a little before reading a changing entry again. The pause
// is real time on purpose: it only spaces out READs of an entry a writer
// is changing (a spin, not a timeout), so a manual clock must not stall it.
func backoff(try int) {
	if try < 4 {
		return
	}
	time.Sleep(time.Duration(min(try, 20)) * 10 * time.Microsecond)
}

// scanNeighbourhood looks for gid in a READ neighbourhood. An entry on the
// move may appear twice; the copy in the higher slot is the current one
// (moves go to higher slots and the source is never updated again). The
// answer holds only if no slot above the match (or none at all, without a
// match) is torn; otherwise torn is set and the caller reads again.
func scanNeighbourhood(b []byte, gid uint32) (n NodeInfo, found, torn bool) {
	for off := 0; off+EntrySize <= len(b); off += EntrySize {
		slot := b[off : off+EntrySize]
		head := binary.LittleEndian.Uint32(slot[offHead:])
		if head != binary.LittleEndian.Uint32(slot[offTail:]) || head&1 != 0 || slot[offState] > stateLive {
			torn = true
			continue
		}
		if slot[offState] != stateLive || binary.LittleEndian.Uint32(slot[offGID:]) != gid {
			continue
		}
		e, _ := decodeEntry(slot)
		n, found, torn = e.node, true, false
	}
	return n, found, torn
}

// listChunk is ListChunk; tests make it smaller.
var listChunk = ListChunk

// Reading the membership map (list): at most mapReadsPerPost slot READs
// are posted at once, and a list whose map kept changing mapTries times
// READs the whole table instead.
const (
	mapReadsPerPost = 16
	mapTries        = 8
)

// list returns the live nodes: from the membership map and the live slots
// when the server keeps a map, otherwise from the whole table.
func (cn *conn) list(ctx context.Context) ([]NodeInfo, error) {
	if cn.boot.MapOffset == 0 {
		return cn.readTable(ctx)
	}
	for try := 0; try < mapTries; try++ {
		out, ok, err := cn.readMembers(ctx)
		if err != nil || ok {
			return out, err
		}
		cn.cl.st.mapRetries.Add(1)
		backoff(try + 4)
	}
	return cn.readTable(ctx)
}

// listBuffer returns the registered landing area of list READs: the
// table's size plus the map's, so that every READ lands at its own offset.
// listMu held.
func (cn *conn) listBuffer() error {
	if cn.listMR != nil {
		return nil
	}
	cn.listMem = make([]byte, int(cn.boot.TableLen)+cn.geom.mapBytes())
	mr, err := cn.cl.pd.RegMR(cn.listMem, verbs.AccessLocalWrite)
	if err != nil {
		cn.listMem = nil
		return err
	}
	cn.listMR = mr
	return nil
}

// readMembers READs the membership map, then the live slots it names, then
// the map's generation again. ok is false if occupancy changed meanwhile
// (the caller tries again).
func (cn *conn) readMembers(ctx context.Context) (_ []NodeInfo, ok bool, err error) {
	cn.listMu.Lock()
	defer cn.listMu.Unlock()
	if err := cn.listBuffer(); err != nil {
		return nil, false, err
	}
	moff := int(cn.boot.MapOffset)
	mlen := cn.geom.mapBytes()
	if err := cn.readList(ctx, []verbs.SendWR{cn.listRead(moff, mlen)}); err != nil {
		return nil, false, err
	}
	gen := binary.LittleEndian.Uint64(cn.listMem[moff:])
	if gen&1 != 0 {
		return nil, false, nil
	}
	var live []int
	for w := range cn.geom.mapWords() {
		word := binary.LittleEndian.Uint64(cn.listMem[moff+8+8*w:])
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &^= 1 << b
			if i := 64*w + b; i < cn.geom.physSlots() {
				live = append(live, i)
			}
		}
	}
	// Runs of adjacent live slots are one READ each.
	var wrs []verbs.SendWR
	for k := 0; k < len(live); {
		j := k + 1
		for j < len(live) && live[j] == live[j-1]+1 {
			j++
		}
		wrs = append(wrs, cn.listRead(int(slotOffset(live[k])), (j-k)*EntrySize))
		k = j
	}
	for len(wrs) > 0 {
		n := min(len(wrs), mapReadsPerPost)
		if err := cn.readList(ctx, wrs[:n]); err != nil {
			return nil, false, err
		}
		wrs = wrs[n:]
	}
	if err := cn.readList(ctx, []verbs.SendWR{cn.listRead(moff, 8)}); err != nil {
		return nil, false, err
	}
	if binary.LittleEndian.Uint64(cn.listMem[moff:]) != gen {
		return nil, false, nil
	}
	out := make([]NodeInfo, 0, len(live))
	for _, i := range live {
		e, err := cn.listedSlot(ctx, i)
		if err != nil {
			return nil, false, err
		}
		if e.live {
			out = append(out, e.node)
		}
	}
	return dedupe(out), true, nil
}

// listedSlot decodes slot i from the list buffer, READing it again alone
// while it is torn. listMu held.
func (cn *conn) listedSlot(ctx context.Context, i int) (entry, error) {
	e, ok := decodeEntry(cn.listMem[slotOffset(i):][:EntrySize])
	start := time.Now()
	for try := 0; !ok; try++ {
		cn.cl.st.tornReads.Add(1)
		if tornTooLong(try, start) {
			return entry{}, fmt.Errorf("meta: slot %d kept changing over %d READs", i, try+1)
		}
		backoff(try)
		var err error
		if e, ok, err = cn.readSlot(ctx, i); err != nil {
			return entry{}, err
		}
	}
	return e, nil
}

// listRead is a READ of n bytes of the table MR at off into the same
// offset of the list buffer.
func (cn *conn) listRead(off, n int) verbs.SendWR {
	return verbs.SendWR{Op: verbs.OpRead, Local: verbs.SGE{MR: cn.listMR, Offset: uint64(off), Length: uint32(n)},
		RemoteAddr: uint64(off), RKey: cn.boot.TableRKey}
}

// readList posts wrs (READs into the list buffer) with one doorbell, the
// last signaled, and waits for them. listMu held.
func (cn *conn) readList(ctx context.Context, wrs []verbs.SendWR) error {
	slot, seq, err := cn.acquire(ctx, opRead)
	if err != nil {
		return err
	}
	for i := range wrs {
		wrs[i].ID, wrs[i].Flags = wrID(slot, seq), 0
	}
	wrs[len(wrs)-1].Flags = verbs.Signaled
	if err := cn.qp.PostSend(wrs); err != nil {
		cn.kill()
		cn.abandon(slot, seq)
		return fmt.Errorf("%w: %v: %v", ErrUnreachable, cn.addr, err)
	}
	abandoned, err := cn.wait(ctx, slot, seq, nil, true)
	if err != nil {
		if abandoned {
			// The READs may still land in the buffer: use new memory
			// next time.
			cn.listMR.Dereg()
			cn.listMR, cn.listMem = nil, nil
		} else {
			cn.finish(slot)
		}
		return err
	}
	cn.cl.st.reads.Add(uint64(len(wrs)))
	cn.finish(slot)
	return nil
}

// readTable READs the whole table in chunks of at most ListChunk bytes,
// posted with one doorbell, and decodes it; torn slots are read again one
// by one.
func (cn *conn) readTable(ctx context.Context) ([]NodeInfo, error) {
	cn.listMu.Lock()
	defer cn.listMu.Unlock()
	n := int(cn.boot.TableLen)
	if err := cn.listBuffer(); err != nil {
		return nil, err
	}
	var wrs []verbs.SendWR
	for off := 0; off < n; off += listChunk {
		wrs = append(wrs, cn.listRead(off, min(listChunk, n-off)))
	}
	if err := cn.readList(ctx, wrs); err != nil {
		return nil, err
	}
	var out []NodeInfo
	for i := range cn.geom.physSlots() {
		e, err := cn.listedSlot(ctx, i)
		if err != nil {
			return nil, err
		}
		if e.live {
			out = append(out, e.node)
		}
	}
	return dedupe(out), nil
}

// readSlot READs one slot.
func (cn *conn) readSlot(ctx context.Context, i int) (entry, bool, error) {
	slot, seq, err := cn.acquire(ctx, opRead)
	if err != nil {
		return entry{}, false, err
	}
	b, abandoned, err := cn.read(ctx, slot, seq, slotOffset(i), EntrySize)
	if err != nil {
		if !abandoned {
			cn.finish(slot)
		}
		return entry{}, false, err
	}
	e, ok := decodeEntry(b)
	cn.finish(slot)
	return e, ok, nil
}

// dedupe keeps, for a gid seen twice (an entry on the move), the copy in
// the higher slot, which came later in out; it returns out sorted by gid.
func dedupe(out []NodeInfo) []NodeInfo {
	last := make(map[uint32]int, len(out))
	for i, n := range out {
		last[n.GID] = i
	}
	res := out[:0]
	for i, n := range out {
		if last[n.GID] == i {
			res = append(res, n)
		}
	}
	sortNodes(res)
	return res
}
