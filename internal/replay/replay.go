// Package replay is an anti-replay window for authenticated packets: the
// receiver of a session remembers which of the last WindowSize counters it
// has accepted, and accepts a counter once, only if it is newer than the
// window's lower edge. This is the sliding window of RFC 6479 (IPsec) and
// WireGuard: a bitmap in 64-bit blocks used as a ring, so that moving the
// window forward clears whole blocks instead of shifting bits.
//
// Check a packet's MAC before calling Accept: Accept moves the window, and
// a forged counter far ahead would otherwise make genuine packets look old.
package replay

const (
	blockBits  = 64
	ringBlocks = 128 // a power of two
	// WindowSize is how far behind the newest accepted counter a packet
	// may arrive (reordered) and still be accepted once.
	WindowSize = (ringBlocks - 1) * blockBits
)

// Window is the receive state of one session. The zero value accepts every
// counter once, starting anywhere. A Window is not safe for concurrent use.
type Window struct {
	last uint64 // highest counter accepted so far (valid when started)
	ring [ringBlocks]uint64
	// started is false until the first Accept.
	started bool
}

// Accept reports whether counter is new (not seen, not too old) and, if
// so, records it.
func (w *Window) Accept(counter uint64) bool {
	if !w.started {
		w.started = true
		w.last = counter
		w.ring[(counter/blockBits)%ringBlocks] |= 1 << (counter % blockBits)
		return true
	}
	if counter > w.last {
		cur := w.last / blockBits
		next := counter / blockBits
		if n := next - cur; n >= ringBlocks {
			clear(w.ring[:])
		} else {
			for i := cur + 1; i <= next; i++ {
				w.ring[i%ringBlocks] = 0
			}
		}
		w.last = counter
	} else if w.last-counter >= WindowSize {
		return false
	}
	blk := &w.ring[(counter/blockBits)%ringBlocks]
	bit := uint64(1) << (counter % blockBits)
	if *blk&bit != 0 {
		return false
	}
	*blk |= bit
	return true
}
