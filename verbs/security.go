package verbs

// SecurityReporter is implemented by a device that authenticates packets
// and defends its connection manager itself (softnic with a cluster key:
// sessions, replay windows, CM cookies). A hardware RNIC does neither in
// software and does not implement it. Callers find it with a type
// assertion on their Device; a device that implements it returns a
// consistent snapshot of monotonic counters (and two gauges) on every call,
// cheap enough for a metrics scrape.
type SecurityReporter interface {
	SecurityStats() SecurityStats
}

// SecurityStats are a device's authentication and connection-manager
// counters.
type SecurityStats struct {
	// Keyed is whether the device authenticates packets (a cluster key);
	// Auth is all zero without one.
	Keyed bool
	Auth  AuthStats
	CM    CMStats
}

// AuthStats count packet authentication. Every drop counted here is also
// in DeviceStats.BadMAC.
type AuthStats struct {
	Sessions      int    // sessions currently known (a gauge)
	Handshakes    uint64 // sessions established (either role)
	BadTag        uint64 // packets without AuthETH or with a wrong tag
	NoSession     uint64 // packets naming an unknown session
	WrongSource   uint64 // packets of a session arriving from another address
	Replayed      uint64 // packets whose counter was seen or is too old
	StaleInit     uint64 // handshake initiations whose timestamp is not newer (replays)
	Parked        uint64 // packets parked awaiting a session (copied once)
	ParkedDropped uint64 // parked packets dropped (queue full)
	Encrypted     uint64 // payload bytes encrypted
}

// CMStats count the connection manager's defences against floods.
type CMStats struct {
	Records      int    // connections accepted, not yet confirmed by the requester (a gauge)
	CookiesSent  uint64 // connection requests answered with a cookie
	BadCookies   uint64 // requests whose cookie was stale or forged (answered with a new one)
	LimitRejects uint64 // requests refused by the per-source or total record limit
}
