package udplink

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/verbs/softnic/link"
	"github.com/krfs/krfs/verbs/softnic/wire"
)

const (
	txMaxMsgs = 64   // messages per sendmmsg
	txMaxIov  = 1024 // iovecs per sendmmsg, over all its messages
	txMaxSegs = 64   // packets per GSO message
)

// txMeta describes one message of a txState: which packets it carries.
type txMeta struct {
	first, n int // pkts[first:first+n]
	seg      int // packet length (the GSO segment size when n > 1)
}

// txState is the reusable memory of one Send: the sendmmsg vector and
// everything it points to, in one heap object so that the pointers stay
// valid and alive across the system call. States live in Link.txCached
// and txPool; a state belongs to exactly one Send while it is out of them.
type txState struct {
	msgs   [txMaxMsgs]unix.Mmsghdr
	names  [txMaxMsgs]unix.RawSockaddrInet6 // big enough for IPv4 too
	ctrl   [txMaxMsgs][4]uint64             // UDP_SEGMENT cmsg; uint64 for alignment
	meta   [txMaxMsgs]txMeta
	iovs   [txMaxIov]unix.Iovec
	one    unix.Msghdr // the one-datagram-at-a-time fallback
	oneIov [2]unix.Iovec
}

// txPool holds txStates. A pool rather than a mutex-guarded state lets
// concurrent Sends run their system calls in parallel, and one blocked on
// a full socket buffer holds up no other sender.
var txPool = sync.Pool{New: func() any { return new(txState) }}

// Send transmits pkts in order; see the package doc for how they are
// grouped. It returns the first error the kernel reported for a message
// (other than drops on EAGAIN/ENOBUFS, which are only counted) after trying
// every message, or ErrClosed.
func (l *Link) Send(pkts []link.Packet) error {
	if len(pkts) == 0 {
		return nil
	}
	l.fdMu.RLock()
	defer l.fdMu.RUnlock()
	if l.fd < 0 || l.closing.Load() {
		return ErrClosed
	}
	if l.rxIdle.Load() && bigReadRequest(pkts) {
		// The receiver waits with nothing predicted: make it predict the
		// READ's destination before the response arrives.
		l.kick()
	}
	// The link's own state first (one atomic swap, and the memory the
	// last Send left in cache); the pool when another Send has it.
	st := l.txCached.Swap(nil)
	if st == nil {
		st = txPool.Get().(*txState)
	}
	err := l.send(st, pkts)
	if !l.txCached.CompareAndSwap(nil, st) {
		txPool.Put(st)
	}
	return err
}

// predictKickMin is the smallest READ whose request makes Send kick a
// receiver that waits with no prediction, so that the response lands in
// place: below it, the response's copy out of scratch (counted) costs
// less than the receiver's extra wake-up.
const predictKickMin = 64 << 10

// bigReadRequest reports whether pkts hold a READ request of at least
// predictKickMin bytes.
func bigReadRequest(pkts []link.Packet) bool {
	for i := range pkts {
		hdr := pkts[i].Hdr
		if len(hdr) < 3 || wire.Opcode(hdr[2]) != wire.OpReadReq {
			continue
		}
		if h, _, err := wire.Parse(hdr); err == nil && h.DMALen >= predictKickMin {
			return true
		}
	}
	return false
}

// send builds messages in st and flushes them whenever st is full. fdMu is
// read-held.
func (l *Link) send(st *txState, pkts []link.Packet) error {
	var firstErr error
	keep := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	gsoMax := int(l.gsoMax.Load())
	nm, ni := 0, 0 // messages and iovecs used in st
	for i := 0; i < len(pkts); {
		p := &pkts[i]
		seg, run := p.Len(), 1
		if seg > 0 && seg <= gsoMax {
			run = gsoRun(pkts[i:], seg, l.maxDatagram)
		}
		if nm == txMaxMsgs || ni+2*run > txMaxIov {
			keep(l.flush(st, pkts, nm))
			clear(st.iovs[:ni])
			nm, ni = 0, 0
		}
		namelen := putSockaddr(&st.names[nm], p.To, l.v6)
		if namelen == 0 {
			l.c.txErrors.Add(uint64(run))
			keep(fmt.Errorf("udplink: send to %v from %v: %w", p.To, l.local, unix.EAFNOSUPPORT))
			i += run
			continue
		}
		iov0 := ni
		for j := i; j < i+run; j++ {
			q := &pkts[j]
			if len(q.Hdr) > 0 {
				setIov(&st.iovs[ni], q.Hdr)
				ni++
			}
			if len(q.Payload) > 0 {
				setIov(&st.iovs[ni], q.Payload)
				ni++
			}
		}
		m := &st.msgs[nm]
		m.Len = 0
		hdr := &m.Hdr
		*hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&st.names[nm])), Namelen: namelen}
		if ni > iov0 {
			hdr.Iov = &st.iovs[iov0]
			hdr.SetIovlen(ni - iov0)
		}
		if run > 1 {
			c := &st.ctrl[nm]
			cm := (*unix.Cmsghdr)(unsafe.Pointer(c))
			cm.Level = unix.SOL_UDP
			cm.Type = unix.UDP_SEGMENT
			cm.SetLen(cmsgLenU16)
			*(*uint16)(unsafe.Add(unsafe.Pointer(c), cmsgDataOff)) = uint16(seg)
			hdr.Control = (*byte)(unsafe.Pointer(c))
			hdr.SetControllen(cmsgSpaceU16)
		}
		st.meta[nm] = txMeta{first: i, n: run, seg: seg}
		nm++
		i += run
	}
	keep(l.flush(st, pkts, nm))
	clear(st.iovs[:ni]) // do not keep callers' buffers reachable from the pool
	return firstErr
}

// gsoRun is how many packets from the start of pkts can go in one GSO
// message: same destination, each as long as the first (seg) except a
// shorter last one, at most txMaxSegs packets and maxTotal bytes.
func gsoRun(pkts []link.Packet, seg, maxTotal int) int {
	to := pkts[0].To
	total, run := seg, 1
	for run < len(pkts) && run < txMaxSegs {
		q := &pkts[run]
		n := q.Len()
		if n == 0 || n > seg || total+n > maxTotal || q.To != to {
			break
		}
		total += n
		run++
		if n < seg {
			break
		}
	}
	return run
}

// flush sends the first nm messages of st.
func (l *Link) flush(st *txState, pkts []link.Packet, nm int) error {
	var firstErr error
	for start := 0; start < nm; {
		// Not a raw system call, although a send rarely blocks: on
		// loopback the kernel may run the woken receiver inside it, and a
		// raw call would keep this thread's P meanwhile (it serialized
		// concurrent callers; see docs/architecture.md).
		sent, e := l.sendMsgs(st.msgs[start:nm])
		l.c.txSyscalls.Add(1)
		if e == 0 {
			if sent <= 0 {
				break // not possible for nm-start > 0; never spin
			}
			for k := start; k < start+sent; k++ {
				l.c.txBytes.Add(uint64(st.msgs[k].Len))
				l.c.txDatagrams.Add(uint64(st.meta[k].n))
				if st.meta[k].n > 1 {
					l.c.txGSOMessages.Add(1)
					if !l.gsoWorked.Load() {
						l.gsoWorked.Store(true)
					}
				}
			}
			start += sent
			continue
		}
		if e == unix.EINTR {
			continue
		}
		// Message start failed; the ones before it were sent.
		m := st.meta[start]
		if m.n > 1 && (e == unix.EIO || e == unix.EINVAL || e == unix.EMSGSIZE) {
			if err := l.sendEach(st, start, pkts[m.first:m.first+m.n], e); err != nil && firstErr == nil {
				firstErr = err
			}
		} else if err := l.failed(e, pkts[m.first].To, m.n); err != nil && firstErr == nil {
			firstErr = err
		}
		start++
	}
	runtime.KeepAlive(st)
	runtime.KeepAlive(pkts)
	return firstErr
}

// sendMsgs sends msgs (at least one) in one system call and returns how
// many went out, setting each one's Len like sendmmsg. A lone message
// goes with sendto when it is one buffer without control data (a READ
// request, an ACK: the header alone), else with sendmsg: the kernel then
// copies no mmsghdr vector, and sendto no msghdr or iovec either. The
// synchronous path sends one message per call on each side.
func (l *Link) sendMsgs(msgs []unix.Mmsghdr) (int, unix.Errno) {
	if len(msgs) > 1 {
		r1, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(l.fd),
			uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), 0, 0, 0)
		return int(r1), e
	}
	m := &msgs[0]
	h := &m.Hdr
	var r1 uintptr
	var e unix.Errno
	if h.Iovlen == 1 && h.Controllen == 0 {
		r1, _, e = unix.Syscall6(unix.SYS_SENDTO, uintptr(l.fd),
			uintptr(unsafe.Pointer(h.Iov.Base)), uintptr(h.Iov.Len), 0,
			uintptr(unsafe.Pointer(h.Name)), uintptr(h.Namelen))
	} else {
		r1, _, e = unix.Syscall(unix.SYS_SENDMSG, uintptr(l.fd), uintptr(unsafe.Pointer(h)), 0)
	}
	if e != 0 {
		return 0, e
	}
	m.Len = uint32(r1)
	return 1, 0
}

// failed counts n packets the kernel refused with e and returns the error
// to report, nil for a drop.
func (l *Link) failed(e unix.Errno, to netip.AddrPort, n int) error {
	l.c.txErrors.Add(uint64(n))
	if e == unix.EAGAIN || e == unix.ENOBUFS {
		l.c.txDrops.Add(uint64(n))
		return nil
	}
	if e == unix.EMSGSIZE {
		// Larger than the route MTU and not allowed to fragment: the
		// route's MTU shrank (ICMP) or the cache is stale. Probe again
		// before the next message.
		l.c.tooBig.Add(uint64(n))
		l.forgetPMTU(to)
	}
	return fmt.Errorf("udplink: send to %v from %v: %w", to, l.local, e)
}

// sendEach resends the packets of GSO message k of st, which the kernel
// rejected with gsoErr, one datagram each. If the first of them goes out,
// the offload was at fault and GSO is restricted (see the package doc).
func (l *Link) sendEach(st *txState, k int, pkts []link.Packet, gsoErr unix.Errno) error {
	l.c.gsoFallbacks.Add(1)
	var firstErr error
	for j := range pkts {
		p := &pkts[j]
		niov := 0
		if len(p.Hdr) > 0 {
			setIov(&st.oneIov[niov], p.Hdr)
			niov++
		}
		if len(p.Payload) > 0 {
			setIov(&st.oneIov[niov], p.Payload)
			niov++
		}
		st.one = unix.Msghdr{Name: st.msgs[k].Hdr.Name, Namelen: st.msgs[k].Hdr.Namelen}
		if niov > 0 {
			st.one.Iov = &st.oneIov[0]
			st.one.SetIovlen(niov)
		}
		var e unix.Errno
		for {
			_, _, e = unix.Syscall(unix.SYS_SENDMSG, uintptr(l.fd), uintptr(unsafe.Pointer(&st.one)), 0)
			l.c.txSyscalls.Add(1)
			if e != unix.EINTR {
				break
			}
		}
		if e == 0 {
			l.c.txDatagrams.Add(1)
			l.c.txBytes.Add(uint64(p.Len()))
			if j == 0 {
				l.restrictGSO(gsoErr, pkts[0].Len())
			}
			continue
		}
		if err := l.failed(e, p.To, 1); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	clear(st.oneIov[:])
	runtime.KeepAlive(st)
	runtime.KeepAlive(pkts)
	return firstErr
}

// restrictGSO reacts to the kernel rejecting a GSO message of seg-byte
// packets with e although the same packets go out one by one.
func (l *Link) restrictGSO(e unix.Errno, seg int) {
	if e == unix.EIO {
		l.gsoMax.Store(0)
		return
	}
	for {
		cur := l.gsoMax.Load()
		if int64(seg) > cur {
			return
		}
		if l.gsoMax.CompareAndSwap(cur, int64(seg-1)) {
			return
		}
	}
}
