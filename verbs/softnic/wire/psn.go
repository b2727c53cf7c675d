package wire

// PSN is a 24-bit packet sequence number. Arithmetic wraps at 2^24;
// comparisons are valid for PSNs less than 2^23 apart, as in IB.
type PSN uint32

// Add returns p+n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Sub returns p-q as a signed distance in (-2^23, 2^23].
func (p PSN) Sub(q PSN) int32 {
	d := (uint32(p) - uint32(q)) & PSNMask
	if d > 1<<23 {
		return int32(d) - 1<<24
	}
	return int32(d)
}

// Less reports whether p comes before q.
func (p PSN) Less(q PSN) bool { return p.Sub(q) < 0 }

// LessEq reports whether p comes before q or equals it.
func (p PSN) LessEq(q PSN) bool { return p.Sub(q) <= 0 }
