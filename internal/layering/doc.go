// Package layering holds the tests of the rule that data flows one way,
// fs -> qpcore -> (dct, meta) -> verbs -> backend (softnic or rdma) ->
// network: no package above the backend may import verbs/softnic or its
// subpackages, and only package nic opens a NIC: every command and
// example (krfs mount, meta and bench, raceboot) asks nic for its device
// and hands it down as a verbs.Device, so each runs on an RNIC as well as
// on softnic. Tests may build softnic devices of their own.
package layering
