package softnic

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"

	"github.com/krfs/krfs/verbs/softnic/wire"
)

// macer computes packet MACs under the cluster key: the first 16 bytes of
// HMAC-SHA256 over header and payload, with the header's MAC field zeroed.
// A macer is not safe for concurrent use; each outbox and the receive path
// own one.
type macer struct {
	h   hash.Hash
	sum [sha256.Size]byte
	hdr [wire.MaxHeaderLen]byte
}

func newMacer(key []byte) *macer {
	if len(key) == 0 {
		return nil
	}
	return &macer{h: hmac.New(sha256.New, key)}
}

// compute returns the MAC of a packet whose header has its MAC field
// zeroed (or is zeroed here in a copy when zero is set).
func (m *macer) compute(hdr, payload []byte, zero bool) []byte {
	m.h.Reset()
	if zero {
		n := copy(m.hdr[:], hdr)
		clear(wire.MACField(m.hdr[:n]))
		m.h.Write(m.hdr[:n])
	} else {
		m.h.Write(hdr)
	}
	m.h.Write(payload)
	return m.h.Sum(m.sum[:0])[:wire.MACLen]
}

// sign fills the MAC field of an encoded header (whose field is zero).
func (m *macer) sign(hdr, payload []byte) {
	copy(wire.MACField(hdr), m.compute(hdr, payload, false))
}

// verify reports whether a received packet carries a valid MAC.
func (m *macer) verify(hdr, payload []byte) bool {
	f := wire.MACField(hdr)
	if f == nil {
		return false
	}
	return hmac.Equal(f, m.compute(hdr, payload, true))
}
