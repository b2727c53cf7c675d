package qpcore

import (
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"
)

// The table of a node's figures. Every field of Stats is in it once, with
// the Prometheus metric that exports it (node/metrics.go, under the krfs_
// namespace) and, for a counter, where the node counts it. Stats fills
// its counters from this table, and the node's metrics and stats.json
// (Stats as JSON, field names as keys) come from it, so a new counter is
// a counters field, a Stats field and one row here. TestStatTable (in
// package node) checks that every row appears in both.

// StatMetric is a Prometheus metric made of one or more fields of Stats.
type StatMetric struct {
	Name   string // without the namespace, e.g. "wrs_posted_total"
	Help   string
	Gauge  bool   // a level now; otherwise a counter, which only grows
	Label  string // the label telling its Fields apart ("" for a single field)
	Fields []StatField
}

// StatField is one field of Stats in a metric.
type StatField struct {
	Field string // the Stats field, also its key in stats.json
	Value string // the metric's label value for it ("" without a label)

	live   func(*counters) *atomic.Uint64 // where the node counts it (nil: filled by Stats)
	derive func(*Stats) float64           // the metric's value, if not the field's
	index  int                            // of Field in Stats
}

// Of is the field's metric value in s.
func (f *StatField) Of(s *Stats) float64 {
	if f.derive != nil {
		return f.derive(s)
	}
	v := reflect.ValueOf(s).Elem().Field(f.index)
	if v.CanUint() {
		return float64(v.Uint())
	}
	return float64(v.Int())
}

// StatMetrics lists the metrics of Stats, every field in exactly one. The
// caller must not change the rows' Fields.
func StatMetrics() []StatMetric { return slices.Clone(statTable) }

var statTable = []StatMetric{
	{Name: "peers", Help: "Peers this node keeps state for.", Gauge: true, Fields: []StatField{{Field: "Peers"}}},
	{Name: "vqps_open", Help: "Virtual QPs open now.", Gauge: true, Fields: []StatField{{Field: "VQPsOpen"}}},
	{Name: "connects_total", Help: "VQP connects, served from known peer state (hit) or after a meta lookup (miss).", Label: "result", Fields: []StatField{
		{Field: "ConnectHits", Value: "hit", live: func(c *counters) *atomic.Uint64 { return &c.connectHits }},
		{Field: "ConnectMisses", Value: "miss", live: func(c *counters) *atomic.Uint64 { return &c.connectMisses }}}},
	{Name: "peer_evictions_total", Help: "Peers evicted from this node's peer table.", Fields: []StatField{
		{Field: "PeerEvictions", live: func(c *counters) *atomic.Uint64 { return &c.peerEvictions }}}},
	{Name: "wrs_posted_total", Help: "Work requests posted, by transport.", Label: "transport", Fields: []StatField{
		{Field: "OpsDC", Value: "dc", live: func(c *counters) *atomic.Uint64 { return &c.opsDC }},
		{Field: "OpsRC", Value: "rc", live: func(c *counters) *atomic.Uint64 { return &c.opsRC }}}},
	{Name: "doorbells_total", Help: "PostSend calls (doorbells) that carried the work requests.", Fields: []StatField{
		{Field: "Doorbells", live: func(c *counters) *atomic.Uint64 { return &c.doorbells }}}},
	{Name: "wr_errors_total", Help: "Operations that ended in an error inside qpcore.", Fields: []StatField{
		{Field: "OpErrors", live: func(c *counters) *atomic.Uint64 { return &c.opErrors }}}},
	{Name: "coalesced_total", Help: "Synchronous operations that waited for an in-flight completion to share its doorbell.", Fields: []StatField{
		{Field: "Coalesced", live: func(c *counters) *atomic.Uint64 { return &c.coalesced }}}},
	{Name: "fences_total", Help: "VQP fences while switching transport.", Fields: []StatField{
		{Field: "Fences", live: func(c *counters) *atomic.Uint64 { return &c.fences }}}},
	{Name: "vqp_switches_total", Help: "VQP moves between DC and RC, by destination transport.", Label: "to", Fields: []StatField{
		{Field: "VQPToRC", Value: "rc", live: func(c *counters) *atomic.Uint64 { return &c.vqpToRC }},
		{Field: "VQPToDC", Value: "dc", live: func(c *counters) *atomic.Uint64 { return &c.vqpToDC }}}},
	{Name: "dcis_free", Help: "Free DCIs in the pool now.", Gauge: true, Fields: []StatField{{Field: "DCIsFree"}}},
	{Name: "dci_waiters", Help: "Peers waiting for a DCI now.", Gauge: true, Fields: []StatField{{Field: "DCIWaiters"}}},
	{Name: "dci_waits_total", Help: "Times a peer waited for a DCI.", Fields: []StatField{
		{Field: "DCIWaits", live: func(c *counters) *atomic.Uint64 { return &c.dciWaits }}}},
	{Name: "dci_yields_total", Help: "Quota yields of a DCI to a waiting peer.", Fields: []StatField{
		{Field: "DCIYields", live: func(c *counters) *atomic.Uint64 { return &c.dciYields }}}},
	{Name: "precheck_rejects_total", Help: "Requests refused by the pre-check before reaching a QP, by cause.", Label: "cause", Fields: []StatField{
		{Field: "RejectLocal", Value: "local_length", live: func(c *counters) *atomic.Uint64 { return &c.rejLocal }},
		{Field: "RejectNoRegion", Value: "no_region", live: func(c *counters) *atomic.Uint64 { return &c.rejNoRegion }},
		{Field: "RejectBounds", Value: "remote_bounds", live: func(c *counters) *atomic.Uint64 { return &c.rejBounds }},
		{Field: "RejectAccess", Value: "remote_access", live: func(c *counters) *atomic.Uint64 { return &c.rejAccess }},
		{Field: "RejectAlign", Value: "alignment", live: func(c *counters) *atomic.Uint64 { return &c.rejAlign }},
		{Field: "RejectOpcode", Value: "opcode", live: func(c *counters) *atomic.Uint64 { return &c.rejOpcode }},
		{Field: "RejectWouldBlock", Value: "would_block", live: func(c *counters) *atomic.Uint64 { return &c.rejWouldBlock }}}},
	{Name: "qp_errors_total", Help: "Error completions on shared QPs.", Fields: []StatField{
		{Field: "QPErrors", live: func(c *counters) *atomic.Uint64 { return &c.qpErrors }}}},
	{Name: "dci_recoveries_total", Help: "DCIs recovered from the error state.", Fields: []StatField{
		{Field: "DCIRecoveries", live: func(c *counters) *atomic.Uint64 { return &c.dciRecoveries }}}},
	{Name: "reposted_total", Help: "Innocent work requests posted again after a QP error.", Fields: []StatField{
		{Field: "Reposted", live: func(c *counters) *atomic.Uint64 { return &c.reposted }}}},
	{Name: "remote_errors_total", Help: "Remote errors reported to the operation's owner.", Fields: []StatField{
		{Field: "RemoteErrors", live: func(c *counters) *atomic.Uint64 { return &c.remoteErrors }}}},
	{Name: "rnr_retries_total", Help: "Operations retried after receiver-not-ready.", Fields: []StatField{
		{Field: "RNRRetries", live: func(c *counters) *atomic.Uint64 { return &c.rnrRetries }}}},
	{Name: "relookups_total", Help: "Meta re-lookups of stale or silent peers.", Fields: []StatField{
		{Field: "Relookups", live: func(c *counters) *atomic.Uint64 { return &c.relookups }}}},
	{Name: "stale_retries_total", Help: "Operations retried after a re-lookup.", Fields: []StatField{
		{Field: "StaleRetries", live: func(c *counters) *atomic.Uint64 { return &c.staleRetries }}}},
	{Name: "unreachable_total", Help: "Peers declared down on evidence of death.", Fields: []StatField{
		{Field: "Unreachable", live: func(c *counters) *atomic.Uint64 { return &c.unreachable }}}},
	{Name: "post_errors_total", Help: "PostSend refusals (the pre-check should make these impossible).", Fields: []StatField{
		{Field: "PostErrors", live: func(c *counters) *atomic.Uint64 { return &c.postErrors }}}},
	{Name: "op_timeouts_total", Help: "Operations ended by their deadline (--timeout).", Fields: []StatField{
		{Field: "OpTimeouts", live: func(c *counters) *atomic.Uint64 { return &c.opTimeouts }}}},
	{Name: "loss_retries_total", Help: "Operations posted again after their QP exhausted its transport retries.", Fields: []StatField{
		{Field: "LossRetries", live: func(c *counters) *atomic.Uint64 { return &c.lossRetries }}}},
	{Name: "peers_down_total", Help: "Times a peer was declared down on evidence of death.", Fields: []StatField{
		{Field: "PeersDown", live: func(c *counters) *atomic.Uint64 { return &c.peersDown }}}},
	{Name: "peers_up_total", Help: "Peers declared down that answered again.", Fields: []StatField{
		{Field: "PeersUp", live: func(c *counters) *atomic.Uint64 { return &c.peersUp }}}},
	{Name: "rc_qps", Help: "RC QPs now, by side (active: opened by this node; passive: accepted).", Gauge: true, Label: "side", Fields: []StatField{
		{Field: "RCActive", Value: "active"}, {Field: "RCPassive", Value: "passive"}}},
	{Name: "rc_connects_total", Help: "RC connections made (ok) or failed.", Label: "result", Fields: []StatField{
		{Field: "RCConnects", Value: "ok", live: func(c *counters) *atomic.Uint64 { return &c.rcConnects }},
		{Field: "RCConnectFailures", Value: "failed", live: func(c *counters) *atomic.Uint64 { return &c.rcConnectFailures }}}},
	{Name: "rc_evictions_total", Help: "RC QPs evicted by the LRU (DC->RC pool full).", Fields: []StatField{
		{Field: "RCEvictions", live: func(c *counters) *atomic.Uint64 { return &c.rcEvictions }}}},
	{Name: "rc_idle_teardowns_total", Help: "RC QPs torn down when idle.", Fields: []StatField{
		{Field: "RCIdle", live: func(c *counters) *atomic.Uint64 { return &c.rcIdle }}}},
	{Name: "rc_fallbacks_total", Help: "VQPs that fell back from RC to DC.", Fields: []StatField{
		{Field: "RCFallbacks", live: func(c *counters) *atomic.Uint64 { return &c.rcFallbacks }}}},
	{Name: "rc_errors_total", Help: "RC QP errors.", Fields: []StatField{
		{Field: "RCErrors", live: func(c *counters) *atomic.Uint64 { return &c.rcErrors }}}},
	{Name: "rc_accepted_total", Help: "Passive RC connections accepted.", Fields: []StatField{
		{Field: "RCAccepted", live: func(c *counters) *atomic.Uint64 { return &c.rcAccepted }}}},
	{Name: "rc_reclaimed_total", Help: "Passive RC QPs reclaimed.", Fields: []StatField{
		{Field: "RCReclaimed", live: func(c *counters) *atomic.Uint64 { return &c.rcReclaimed }}}},
	{Name: "rc_slot_waits_total", Help: "Times an RC-only peer's connection found the RC pool full with nothing idle to reclaim, and waited.", Fields: []StatField{
		{Field: "RCSlotWaits", live: func(c *counters) *atomic.Uint64 { return &c.rcSlotWaits }}}},
	{Name: "device_events_total", Help: "Asynchronous events of the NIC, by event (rc_passive_error: a passive RC QP in ERR, destroyed; qp_error, cq_error, srq_limit, port_down, port_up).", Label: "event", Fields: []StatField{
		{Field: "RCPassiveErrors", Value: "rc_passive_error", live: func(c *counters) *atomic.Uint64 { return &c.rcPassiveErrors }},
		{Field: "QPEvents", Value: "qp_error", live: func(c *counters) *atomic.Uint64 { return &c.qpEvents }},
		{Field: "CQErrors", Value: "cq_error", live: func(c *counters) *atomic.Uint64 { return &c.cqErrors }},
		{Field: "SRQLimits", Value: "srq_limit", live: func(c *counters) *atomic.Uint64 { return &c.srqLimits }},
		{Field: "PortDowns", Value: "port_down", live: func(c *counters) *atomic.Uint64 { return &c.portDowns }},
		{Field: "PortUps", Value: "port_up", live: func(c *counters) *atomic.Uint64 { return &c.portUps }}}},
	{Name: "dir_reads_total", Help: "Remote region directory READs, by result (ok or torn and repeated).", Label: "result", Fields: []StatField{
		{Field: "DirReads", Value: "ok", live: func(c *counters) *atomic.Uint64 { return &c.dirReads },
			derive: func(s *Stats) float64 { return float64(s.DirReads - min(s.DirTorn, s.DirReads)) }},
		{Field: "DirTorn", Value: "torn", live: func(c *counters) *atomic.Uint64 { return &c.dirTorn }}}},
	{Name: "dir_hints_total", Help: "Pre-checks of a peer's default region answered by its meta entry's hint, with no directory READ.", Fields: []StatField{
		{Field: "DirHints", live: func(c *counters) *atomic.Uint64 { return &c.dirHints }}}},
	{Name: "messages_total", Help: "Messages, by event (sent, received, rendezvous, dropped, malformed; refused by this node, full_retry: sent again to a full port, staged: pulled ahead of its reader, stage_full: left waiting, the staging budget spent).", Label: "event", Fields: []StatField{
		{Field: "MsgSent", Value: "sent", live: func(c *counters) *atomic.Uint64 { return &c.msgSent }},
		{Field: "MsgRecv", Value: "received", live: func(c *counters) *atomic.Uint64 { return &c.msgRecv }},
		{Field: "MsgRendezvous", Value: "rendezvous", live: func(c *counters) *atomic.Uint64 { return &c.msgRendezvous }},
		{Field: "MsgDropped", Value: "dropped", live: func(c *counters) *atomic.Uint64 { return &c.msgDropped }},
		{Field: "MsgMalformed", Value: "malformed", live: func(c *counters) *atomic.Uint64 { return &c.msgMalformed }},
		{Field: "MsgRefused", Value: "refused", live: func(c *counters) *atomic.Uint64 { return &c.msgRefused }},
		{Field: "MsgFullRetries", Value: "full_retry", live: func(c *counters) *atomic.Uint64 { return &c.msgFullRetries }},
		{Field: "MsgStaged", Value: "staged", live: func(c *counters) *atomic.Uint64 { return &c.msgStaged }},
		{Field: "MsgStageFull", Value: "stage_full", live: func(c *counters) *atomic.Uint64 { return &c.msgStageFull }}}},
	{Name: "message_bytes_total", Help: "Message payload bytes delivered, by path (small or large).", Label: "path", Fields: []StatField{
		{Field: "MsgSmallBytes", Value: "small", live: func(c *counters) *atomic.Uint64 { return &c.msgSmallBytes }},
		{Field: "MsgLargeBytes", Value: "large", live: func(c *counters) *atomic.Uint64 { return &c.msgLargeBytes }}}},
	{Name: "message_copied_bytes_total", Help: "Message payload bytes qpcore copied, by path (small: the sender's bounce buffer and the receiver's copy out; large: staged messages only).", Label: "path", Fields: []StatField{
		{Field: "MsgSmallCopied", Value: "small", live: func(c *counters) *atomic.Uint64 { return &c.msgSmallCopied }},
		{Field: "MsgLargeCopied", Value: "large", live: func(c *counters) *atomic.Uint64 { return &c.msgLargeCopied }}}},
	{Name: "message_recv_buffers", Help: "Receive buffers registered and posted for messages now.", Gauge: true, Fields: []StatField{{Field: "MsgRecvBuffers"}}},
	{Name: "mem_cache_total", Help: "Local buffer registration cache lookups, by result (hit, miss, eviction).", Label: "result", Fields: []StatField{
		{Field: "MemHits", Value: "hit"}, {Field: "MemMisses", Value: "miss"}, {Field: "MemEvictions", Value: "eviction"}}},
	{Name: "mem_uncached_total", Help: "Buffers too large for the registration cache, registered for their operation only.", Fields: []StatField{{Field: "MemUncached"}}},
	{Name: "mem_cache_entries", Help: "Caller buffers the registration cache keeps registered now.", Gauge: true, Fields: []StatField{{Field: "MemCached"}}},
	{Name: "mem_cache_bytes", Help: "Bytes of caller buffers the registration cache keeps registered (and reachable) now.", Gauge: true, Fields: []StatField{{Field: "MemCachedBytes"}}},
}

// statCounters are the rows the node counts itself, for Stats.
var statCounters []*StatField

func init() {
	t := reflect.TypeFor[Stats]()
	seen := map[string]bool{}
	for i := range statTable {
		for j := range statTable[i].Fields {
			f := &statTable[i].Fields[j]
			sf, ok := t.FieldByName(f.Field)
			if !ok || seen[f.Field] || (f.live != nil && sf.Type.Kind() != reflect.Uint64) {
				panic(fmt.Sprintf("qpcore: stat table: field %q missing, twice, or not a counter", f.Field))
			}
			seen[f.Field] = true
			f.index = sf.Index[0]
			if f.live != nil {
				statCounters = append(statCounters, f)
			}
		}
	}
}
