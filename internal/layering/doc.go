// Package layering holds the test of the rule that data flows one way,
// fs -> qpcore -> (dct, meta) -> verbs -> backend (softnic) -> UDP: no
// package above the backend may import verbs/softnic or its subpackages.
// Only the composition roots (cmd/krfs, internal/bench) open a softnic
// NIC and hand it down as a verbs.Device.
package layering
