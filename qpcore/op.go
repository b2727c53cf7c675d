package qpcore

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/krfs/krfs/verbs"
)

// OpCode is a VQP operation.
type OpCode uint8

const (
	OpRead OpCode = iota + 1
	OpWrite
	OpCompareAndSwap
	OpFetchAdd
	// Internal operations, never accepted from callers.
	opRawRead // READ by rkey, bounds known (directory, rendezvous)
	opSend    // two-sided SEND of a message
)

func (o OpCode) String() string {
	switch o {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	case OpCompareAndSwap:
		return "CMP_SWAP"
	case OpFetchAdd:
		return "FETCH_ADD"
	case opRawRead:
		return "RAW_READ"
	case opSend:
		return "SEND"
	}
	return fmt.Sprintf("OpCode(%d)", uint8(o))
}

func (o OpCode) verb() verbs.Opcode {
	switch o {
	case OpRead, opRawRead:
		return verbs.OpRead
	case OpWrite:
		return verbs.OpWrite
	case OpCompareAndSwap:
		return verbs.OpCmpSwap
	case OpFetchAdd:
		return verbs.OpFetchAdd
	case opSend:
		return verbs.OpSend
	}
	return 0
}

func (o OpCode) atomic() bool { return o == OpCompareAndSwap || o == OpFetchAdd }

// Transport is what a VQP's operations travel on.
type Transport uint8

const (
	DC Transport = iota // a shared DCI of the pool
	RC                  // the peer's RC QP
)

func (t Transport) String() string {
	switch t {
	case DC:
		return "dc"
	case RC:
		return "rc"
	}
	return fmt.Sprintf("Transport(%d)", uint8(t))
}

// opState is where an operation is. Transitions:
//
//	        enqueue               kick: PostSend          success / final error
//	new ---------------> queued ----------------> posted ----------------------> done
//	 |                    ^  ^                      |
//	 | fence              |  +---- requeue ---------+ flushed innocent, retry
//	 v                    |                         |
//	held ---- settle -----+                         +--> stalled --(re-lookup / RNR backoff)--> queued
//
// queued and held operations may also end (done) on cancellation or on a
// peer found unreachable; stalled ones end when their retry is used up.
type opState uint8

// opNext lists the allowed transitions: bit s of opNext[from] allows
// from -> s (a bit test, as every op makes three).
var opNext = [...]uint8{
	opNew:     1<<opHeld | 1<<opQueued | 1<<opDone,
	opHeld:    1<<opQueued | 1<<opDone,
	opQueued:  1<<opPosted | 1<<opDone,
	opPosted:  1<<opStalled | 1<<opDone,
	opStalled: 1<<opQueued | 1<<opStalled | 1<<opDone,
	opDone:    0,
}

// setState moves o to state to; a transition the diagram does not allow is
// a bug and panics.
func (o *op) setState(to opState) {
	if int(o.state) < len(opNext) && opNext[o.state]&(1<<to) != 0 {
		o.state = to
		return
	}
	panic(fmt.Sprintf("qpcore: %v op %d: %v -> %v", o.code, o.id, o.state, to))
}

const (
	opNew opState = iota
	opHeld
	opQueued
	opPosted
	opStalled
	opDone
)

func (s opState) String() string {
	switch s {
	case opNew:
		return "new"
	case opHeld:
		return "held"
	case opQueued:
		return "queued"
	case opPosted:
		return "posted"
	case opStalled:
		return "stalled"
	case opDone:
		return "done"
	}
	return fmt.Sprintf("opState(%d)", uint8(s))
}

// op is one operation of a VQP. Fields set at creation are immutable;
// the rest is guarded by the peer's mu until the op is done, when its
// result fields belong to whoever waits for it.
type op struct {
	id   uint64
	v    *VQP
	p    *peer
	code OpCode
	sys  bool // internal: needs no region directory
	dir  bool // the READ of the peer's region directory (rkey: the DirRKey it was posted with)

	local  []byte
	mem    *memEntry
	lmr    verbs.MR // the MR behind local (from mem, or made for this op)
	tmp    bool     // lmr was registered for this op alone: deregister when done
	loff   uint64
	sink   int32 // atomics: slot in the sink pool, -1 if none
	region string
	rkey   uint32 // raw ops; user ops resolve it from the directory at post time
	off    uint64
	cmp    uint64
	swp    uint64

	userID   uint64
	seq      uint64 // async: position among the VQP's async ops
	async    bool
	deadline time.Time // SEND: give up RNR retries after it
	expires  time.Time // the operation's hard deadline (zero: none; see liveness.go)
	onDone   func(*op) // internal completion hook, run with no lock held

	state   opState
	mayRun  bool // posted since the responder last refused it: an atomic may have executed
	route   Transport
	dci     *dciSlot // what it is posted on
	rc      *rcConn
	retries int // re-lookups spent on it

	done  chan struct{} // sync ops: receives one value when done
	fin   atomic.Uint32 // sync ops: finPending, then finDone, then finReleased (see deliver)
	ready func() bool   // sync ops from syncOp: whether it is done, for a driver (kept when recycled)
	err   error
	old   uint64
}

// A synchronous op's fin: its deliverer stores finDone before it sends on
// done (a driver's ready condition) and finReleased once it no longer
// touches the op, which only then may be recycled.
const (
	finPending uint32 = iota
	finDone
	finReleased
)

func (o *op) length() int {
	if o.code.atomic() {
		return verbs.AtomicSize
	}
	return len(o.local)
}

func newOp() *op { return &op{sink: -1} }

// syncOp returns an op for a synchronous caller, with its done channel and
// ready condition: one that recycle kept, or a new one. Reusing them saves
// a synchronous READ its allocations (the op, its channel, the closure).
func (n *Node) syncOp() *op {
	if o, _ := n.syncOps.Get().(*op); o != nil {
		return o
	}
	o := newOp()
	o.done = make(chan struct{}, 1)
	o.ready = func() bool { return n.opReady(o) }
	return o
}

// recycle keeps o, a synchronous op whose caller has taken its result,
// for the next syncOp, if its deliverer has let go of it (finReleased);
// otherwise the garbage collector takes it. Nothing refers to a done op
// but its caller: it has left the op table, its queue and its QP.
func (n *Node) recycle(o *op) {
	if o.ready == nil || o.fin.Load() != finReleased {
		return
	}
	select {
	case <-o.done: // sent, and not consumed by a driver
	default:
	}
	done, ready := o.done, o.ready
	*o = op{sink: -1, done: done, ready: ready}
	n.syncOps.Put(o)
}

// opQueue is a FIFO of ops.
type opQueue struct {
	q    []*op
	head int
}

func (q *opQueue) len() int { return len(q.q) - q.head }

func (q *opQueue) push(o *op) { q.q = append(q.q, o) }

// pushFront puts ops, in order, before everything queued.
func (q *opQueue) pushFront(ops []*op) {
	if len(ops) == 0 {
		return
	}
	rest := q.q[q.head:]
	nq := make([]*op, 0, len(ops)+len(rest))
	nq = append(nq, ops...)
	nq = append(nq, rest...)
	q.q, q.head = nq, 0
}

func (q *opQueue) at(i int) *op { return q.q[q.head+i] }

// drop removes the first n ops.
func (q *opQueue) drop(n int) {
	clear(q.q[q.head : q.head+n])
	q.head += n
	if q.head == len(q.q) {
		q.q, q.head = q.q[:0], 0
	} else if q.head > 64 && q.head*2 > len(q.q) {
		k := copy(q.q, q.q[q.head:])
		clear(q.q[k:])
		q.q, q.head = q.q[:k], 0
	}
}

// take removes and returns everything.
func (q *opQueue) take() []*op {
	out := append([]*op(nil), q.q[q.head:]...)
	clear(q.q)
	q.q, q.head = q.q[:0], 0
	return out
}

// remove deletes o; it reports whether o was there.
func (q *opQueue) remove(o *op) bool {
	for i := q.head; i < len(q.q); i++ {
		if q.q[i] == o {
			copy(q.q[i:], q.q[i+1:])
			q.q[len(q.q)-1] = nil
			q.q = q.q[:len(q.q)-1]
			return true
		}
	}
	return false
}

// filter keeps the ops for which keep returns true, in order, and
// returns the others in order.
func (q *opQueue) filter(keep func(*op) bool) []*op {
	var out []*op
	k := q.head
	for i := q.head; i < len(q.q); i++ {
		o := q.q[i]
		if keep(o) {
			q.q[k] = o
			k++
		} else {
			out = append(out, o)
		}
	}
	clear(q.q[k:])
	q.q = q.q[:k]
	return out
}

// takeOps removes from *ops, in place, those for which take returns
// true, and returns them; both keep their order.
func takeOps(ops *[]*op, take func(*op) bool) []*op {
	s := *ops
	var out []*op
	k := 0
	for _, o := range s {
		if take(o) {
			out = append(out, o)
		} else {
			s[k] = o
			k++
		}
	}
	clear(s[k:])
	*ops = s[:k]
	return out
}

// opTable maps WR IDs to ops. An ID is the op's slot in the table (low
// 32 bits) and the count of ops added when it was made (high 32 bits,
// never 0), so that a late completion of a finished op never matches the
// op that took its slot since. A slot is an index, not a hash: a READ adds,
// finds and deletes its op once each.
type opTable struct {
	mu    sync.Mutex // guards the fields below
	slots []*op
	free  []uint32 // empty slots
	count uint32   // ops added, wrapping (skipping 0)
	live  int      // ops in the table
}

func (t *opTable) add(o *op) {
	t.mu.Lock()
	var i uint32
	if k := len(t.free); k > 0 {
		i = t.free[k-1]
		t.free = t.free[:k-1]
	} else {
		i = uint32(len(t.slots))
		t.slots = append(t.slots, nil)
	}
	t.count++
	if t.count == 0 {
		t.count = 1
	}
	o.id = uint64(t.count)<<32 | uint64(i)
	t.slots[i] = o
	t.live++
	t.mu.Unlock()
}

func (t *opTable) get(id uint64) *op {
	i := uint32(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if int(i) < len(t.slots) {
		if o := t.slots[i]; o != nil && o.id == id {
			return o
		}
	}
	return nil
}

func (t *opTable) del(o *op) {
	i := uint32(o.id)
	t.mu.Lock()
	if int(i) < len(t.slots) && t.slots[i] == o {
		t.slots[i] = nil
		t.free = append(t.free, i)
		t.live--
	}
	t.mu.Unlock()
}

func (t *opTable) all() []*op {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*op, 0, t.live)
	for _, o := range t.slots {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}
