package softnic

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/krfs/krfs/verbs"
)

// pd is a protection domain.
type pd struct {
	dev *Device
	id  uint32
}

var _ verbs.PD = (*pd)(nil)

func (p *pd) Device() verbs.Device { return p.dev }

// mr is a registered memory region. buf, iova, access, keys and pd never
// change; dead flips once on deregistration.
//
// private says that no peer can reach the MR's memory: the MR has no
// remote access and no live MR of the device with remote access overlaps
// it. Only private memory may receive a predicted payload (a READ
// response steered into place), because a mis-predicted datagram leaves
// its bytes there until the right packet replaces them, and no one may
// see them meanwhile. It starts true for a local-only MR and is cleared,
// for good, when a remotely accessible MR over the same bytes is
// registered.
type mr struct {
	dev     *Device
	pd      *pd
	buf     []byte
	iova    uint64 // remote address of buf[0]: its offset in its page, as the kernel requires
	access  verbs.Access
	lkey    uint32
	rkey    uint32
	dead    atomic.Bool
	private atomic.Bool
}

var _ verbs.MR = (*mr)(nil)

func (m *mr) Buf() []byte          { return m.buf }
func (m *mr) IOVA() uint64         { return m.iova }
func (m *mr) LKey() uint32         { return m.lkey }
func (m *mr) RKey() uint32         { return m.rkey }
func (m *mr) Access() verbs.Access { return m.access }
func (m *mr) PD() verbs.PD         { return m.pd }

// RegMR registers buf at IOVA verbs.PageOffset(buf), as ibv_reg_mr must:
// remote requests name buf[i] at iova+i, so a peer that addresses a
// buffer that does not start on a page boundary by offsets alone misses
// (ReasonBounds, or the wrong bytes), as it would on an RNIC. Keys are
// random and unique on the device, so they cannot be guessed from one
// another.
func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("%w: empty buffer", verbs.ErrLength)
	}
	if uint64(len(buf)) > MaxMRSize {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte MR limit", verbs.ErrLength, len(buf), uint64(MaxMRSize))
	}
	if access&^verbs.AccessAll != 0 {
		return nil, fmt.Errorf("%w: unknown access flags %#x", verbs.ErrInvalidArg, uint8(access))
	}
	// As on hardware, remote write and atomic access need local write.
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write or atomic access requires local write", verbs.ErrInvalidArg)
	}
	d := p.dev
	m := &mr{dev: d, pd: p, buf: buf, iova: verbs.PageOffset(buf), access: access}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	for {
		k := d.randUint32()
		if k == 0 {
			continue
		}
		if _, used := d.mrs[k]; used {
			continue
		}
		m.lkey, m.rkey = k, k
		break
	}
	d.mrs[m.rkey] = m
	d.mrBytes += uint64(len(buf))
	d.markPrivateLocked(m)
	return m, nil
}

// remoteAccess are the access flags that let a peer reach an MR.
const remoteAccess = verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic

// markPrivateLocked sets the private flag of a new MR m and clears it on
// the MRs that m exposes. d.mu is held. It walks every MR, which
// registration can afford: remotely accessible MRs are few and long-lived.
func (d *Device) markPrivateLocked(m *mr) {
	remote := m.access&remoteAccess != 0
	private := !remote
	for _, o := range d.mrs {
		if o == m || o.dead.Load() || !overlaps(o.buf, m.buf) {
			continue
		}
		if remote {
			o.private.Store(false)
		} else if o.access&remoteAccess != 0 {
			private = false
		}
	}
	m.private.Store(private)
}

// overlaps reports whether a and b share a byte.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	alo, blo := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return alo < blo+uintptr(len(b)) && blo < alo+uintptr(len(a))
}

// Dereg unregisters the MR. It waits for a receive in progress that may be
// placing payload into it, so that once Dereg returns the NIC no longer
// touches the memory; remote requests with the old rkey then fail with a
// remote access error.
func (m *mr) Dereg() error {
	d := m.dev
	d.lockRx()
	defer d.rxMu.Unlock()
	if m.dead.Swap(true) {
		return fmt.Errorf("%w: MR rkey %#x", verbs.ErrMRDead, m.rkey)
	}
	d.mu.Lock()
	delete(d.mrs, m.rkey)
	d.mrBytes -= uint64(len(m.buf))
	d.mu.Unlock()
	return nil
}

// lookupRKey returns the live MR for rkey, or nil.
func (d *Device) lookupRKey(rkey uint32) *mr {
	d.mu.RLock()
	m := d.mrs[rkey]
	d.mu.RUnlock()
	if m == nil || m.dead.Load() {
		return nil
	}
	return m
}

// checkLocal validates a local SGE for a QP of protection domain p.
func checkLocal(p *pd, s verbs.SGE, need verbs.Access) error {
	if s.MR == nil {
		return verbs.ErrNoMR
	}
	m, ok := s.MR.(*mr)
	if !ok || m.dev != p.dev {
		return fmt.Errorf("%w: MR of another device", verbs.ErrNoMR)
	}
	if m.dead.Load() {
		return fmt.Errorf("%w: lkey %#x", verbs.ErrMRDead, m.lkey)
	}
	if m.pd != p {
		return verbs.ErrWrongPD
	}
	if s.Offset > uint64(len(m.buf)) || uint64(s.Length) > uint64(len(m.buf))-s.Offset {
		return fmt.Errorf("%w: [%d, +%d) of a %d-byte MR", verbs.ErrBounds, s.Offset, s.Length, len(m.buf))
	}
	if need != 0 && m.access&need != need {
		return fmt.Errorf("%w: have %v, need %v", verbs.ErrAccess, m.access, need)
	}
	return nil
}

// remoteCheck validates a remote access of n bytes at address va (the
// MR's IOVA plus an offset) against MR m for a responder QP of protection
// domain p. It returns the memory and a NAK reason.
func remoteCheck(p *pd, m *mr, va uint64, n uint64, need verbs.Access) ([]byte, verbs.Reason) {
	if m == nil || m.pd != p {
		return nil, verbs.ReasonRKey
	}
	if va < m.iova {
		return nil, verbs.ReasonBounds
	}
	va -= m.iova
	if va > uint64(len(m.buf)) || n > uint64(len(m.buf))-va {
		return nil, verbs.ReasonBounds
	}
	if m.access&need != need {
		return nil, verbs.ReasonPerm
	}
	return m.buf[va : va+n], verbs.ReasonNone
}
