package qpcore

import (
	"time"

	"github.com/krfs/krfs/clock"
	"github.com/krfs/krfs/meta"
)

// dirCache is a peer's cached region directory (see peerdir.go for how
// it is read and used). Guarded by the peer's mu.
type dirCache struct {
	regions map[string]Region
	valid   bool
	// hint: regions holds only the default region, from the meta
	// entry's hint (no directory READ yet); hintOwner: the hint also
	// carries the region's mode and owner (the entry had them), so it
	// can answer a stat (FreshRegion).
	hint, hintOwner bool
	fetching        bool
	wait            chan struct{} // closed when the fetch in progress ends
	err             error
	at              time.Time
	torn            int       // torn READs in a row
	tornSince       time.Time // clock time of the first of them
}

// full reports whether the cache holds the directory itself, not a hint.
func (d *dirCache) full() bool { return d.valid && !d.hint }

// invalidate makes the next user operation read the directory again.
func (d *dirCache) invalidate() { d.valid, d.hint = false, false }

// reset forgets the cache (the peer's metadata changed) and seeds it
// again from info.
func (d *dirCache) reset(info *meta.NodeInfo, c clock.Clock) {
	d.invalidate()
	d.regions = nil
	d.seed(info, c)
}

// seed starts an empty cache with the default region from the meta entry
// info, if the entry has one.
func (d *dirCache) seed(info *meta.NodeInfo, c clock.Clock) {
	if d.valid || d.fetching || info.MemRKey == 0 || info.MemLen == 0 {
		return
	}
	r := Region{Name: DefaultRegion, RKey: info.MemRKey, Len: info.MemLen, Access: info.MemAccess}
	if info.MemOwnerKnown {
		r.Mode, r.UID, r.GID = info.MemMode, info.MemUID, info.MemGID
	}
	d.regions = map[string]Region{DefaultRegion: r}
	d.valid, d.hint, d.hintOwner, d.at = true, true, info.MemOwnerKnown, c.Now()
}

// ownerHint reports whether the cache is a hint that can describe name
// fully (mode and owner included) and is no older than maxAge.
func (d *dirCache) ownerHint(name string, maxAge time.Duration, c clock.Clock) bool {
	return name == DefaultRegion && d.hint && d.hintOwner && d.valid && !d.fetching &&
		maxAge > 0 && clock.Since(c, d.at) <= maxAge
}

// done ends a fetch with the regions read, or err, and wakes its waiters.
func (d *dirCache) done(regions map[string]Region, err error, now time.Time) {
	if err != nil {
		d.err = err
		d.invalidate()
	} else {
		d.regions, d.valid, d.hint, d.at, d.err = regions, true, false, now, nil
	}
	if d.wait != nil {
		close(d.wait)
		d.wait = nil
	}
}
