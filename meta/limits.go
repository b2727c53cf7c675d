package meta

import (
	"net/netip"
	"time"
)

// Per-source registration limits (AuthConfig): a token bucket of
// registrations per source IP address, and a count of the live entries
// each source registered. Both are kept by the server's loop.

// buckets are the token buckets of the sources that registered lately.
type buckets map[netip.Addr]*bucket

type bucket struct {
	tokens float64
	last   time.Time
}

// take spends one of src's tokens at now, refilled at cfg.RegisterRate
// up to cfg.RegisterBurst; false when none is left. Without a rate it
// always succeeds and keeps nothing.
func (b *buckets) take(src netip.Addr, now time.Time, cfg *AuthConfig) bool {
	if cfg.RegisterRate <= 0 {
		return true
	}
	if *b == nil {
		*b = make(buckets)
	}
	k := (*b)[src]
	if k == nil {
		k = &bucket{tokens: float64(cfg.RegisterBurst), last: now}
		(*b)[src] = k
	}
	if d := now.Sub(k.last); d > 0 {
		k.tokens = min(float64(cfg.RegisterBurst), k.tokens+d.Seconds()*cfg.RegisterRate)
		k.last = now
	}
	if k.tokens < 1 {
		return false
	}
	k.tokens--
	return true
}

// maxBuckets is how many sources' buckets are kept before full ones are
// dropped (a full bucket is what a new one starts as).
const maxBuckets = 4096

// prune drops the buckets that have refilled, once there are many.
func (b *buckets) prune(now time.Time, cfg *AuthConfig) {
	if len(*b) <= maxBuckets {
		return
	}
	for src, k := range *b {
		if k.tokens+now.Sub(k.last).Seconds()*cfg.RegisterRate >= float64(cfg.RegisterBurst) {
			delete(*b, src)
		}
	}
}

// count is the number of live entries src registered (forgetting those
// that ended or another source took over).
func (g *guard) count(r *registry, src netip.Addr) int {
	set := g.bySrc[src]
	for gid, l := range set {
		if r.nodes[gid] != l {
			delete(set, gid)
		}
	}
	return len(set)
}

// prune forgets the records of leases that ended.
func (g *guard) prune(r *registry) {
	for gid, o := range g.owners {
		if r.nodes[gid] != o.l {
			delete(g.owners, gid)
			delete(g.bySrc[o.src], gid)
		}
	}
	for src, set := range g.bySrc {
		if len(set) == 0 {
			delete(g.bySrc, src)
		}
	}
}
