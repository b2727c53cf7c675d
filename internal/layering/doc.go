// Package layering holds the tests of the rule that data flows one way
// through the layers, top to bottom:
//
//	fs, node -> qpcore -> dct, meta -> verbs -> backend (verbs/softnic, verbs/rdma)
//
// node implements fs's backend interfaces and imports fs and qpcore; fs
// imports nothing of krfs. Only package nic opens a backend: every command
// and example (krfs mount, meta and bench, raceboot) asks nic for its device
// and hands it down as a verbs.Device, so each runs on an RNIC as well as
// on softnic. clock is the leaf every layer injects. Programs (cmd/,
// examples/, tests/) and the benchmark suite (bench, bench/report) sit on
// top: nothing below imports them, and internal/ holds only helpers used
// from below (internal/replay by softnic, internal/shm by node).
//
// The rules are a table in layering_test.go, one forbidden set of edges
// each, like depguard rules; a violation names the edge and the rule, and
// every rule is checked against an edge it must reject. Tests may import
// what they measure or fake (softnic devices, the baselines of
// bench/baseline).
package layering
