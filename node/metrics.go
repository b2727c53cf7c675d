package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/krfs/krfs/fs"
	"github.com/krfs/krfs/qpcore"
	"github.com/krfs/krfs/verbs"
)

// Prometheus metrics of a node (--metrics-addr).
//
// Two sources feed them:
//   - the node's collector reads the node's counters at scrape time (qpcore,
//     the NIC and its QPs, the NIC's authentication and connection manager
//     if it reports them through verbs.SecurityReporter, meta client,
//     regions); nothing is counted
//     twice and nothing runs between scrapes;
//   - OpMetrics counts what the filesystem asks of peers (operations,
//     bytes and latency by opcode and transport), measured around each
//     fs.Conn call: the latency includes qpcore's queueing, the pre-check
//     and the network, not the FUSE round trip.

const metricsNS = "krfs"

// OpMetrics are measured around each operation on a peer (see Metered).
type OpMetrics struct {
	ops     *prometheus.CounterVec
	bytes   *prometheus.CounterVec
	errs    *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

func NewOpMetrics() *OpMetrics {
	return &OpMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Name: "ops_total",
			Help: "Operations on peers that completed, by opcode and the transport of the VQP (dc or rc)."},
			[]string{"op", "transport"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Name: "op_bytes_total",
			Help: "Payload bytes of completed operations on peers, by opcode and transport."},
			[]string{"op", "transport"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Name: "op_failures_total",
			Help: "Operations on peers that failed, by opcode."}, []string{"op"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNS, Name: "op_duration_seconds",
			Help: "Latency of operations on peers (qpcore and network; FUSE excluded), by opcode.",
			// 2 us .. ~4 s in powers of two.
			Buckets: prometheus.ExponentialBuckets(2e-6, 2, 22)}, []string{"op"}),
	}
}

func (m *OpMetrics) register(r prometheus.Registerer) {
	r.MustRegister(m.ops, m.bytes, m.errs, m.latency)
}

func (m *OpMetrics) observe(op string, c fs.Conn, start time.Time, n int, err error) {
	m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		m.errs.WithLabelValues(op).Inc()
		return
	}
	tr := "unknown"
	if vc, ok := c.(*vqpConn); ok {
		tr = vc.v.Transport().String()
	}
	m.ops.WithLabelValues(op, tr).Inc()
	m.bytes.WithLabelValues(op, tr).Add(float64(n))
}

// Metered returns b with its peer connections measured into ops.
func Metered(b fs.Backend, ops *OpMetrics) fs.Backend {
	mb := &meteredBackend{Backend: b, m: ops}
	if r, ok := b.(fs.BufferRegistrar); ok {
		return &meteredRegistrar{meteredBackend: mb, r: r}
	}
	return mb
}

// meteredBackend is an fs.Backend whose peer connections are measured.
type meteredBackend struct {
	fs.Backend
	m *OpMetrics
}

func (b *meteredBackend) Connect(ctx context.Context, gid uint32) (fs.Conn, error) {
	c, err := b.Backend.Connect(ctx, gid)
	if err != nil {
		return nil, err
	}
	return &meteredConn{Conn: c, m: b.m}, nil
}

// meteredRegistrar is a meteredBackend over a backend that registers I/O
// buffers (an embedded fs.Backend would hide those methods).
type meteredRegistrar struct {
	*meteredBackend
	r fs.BufferRegistrar
}

func (b *meteredRegistrar) RegisterIOBuffers(p *fs.IOBuffers) error { return b.r.RegisterIOBuffers(p) }
func (b *meteredRegistrar) UnregisterIOBuffers(p *fs.IOBuffers) error {
	return b.r.UnregisterIOBuffers(p)
}

func (b *meteredRegistrar) RegisterMemory(m []byte) error {
	r, ok := b.r.(fs.MemoryRegistrar)
	if !ok {
		return errors.New("the backend cannot register memory")
	}
	return r.RegisterMemory(m)
}

func (b *meteredRegistrar) UnregisterMemory(m []byte) error {
	r, ok := b.r.(fs.MemoryRegistrar)
	if !ok {
		return errors.New("the backend cannot register memory")
	}
	return r.UnregisterMemory(m)
}

type meteredConn struct {
	fs.Conn
	m *OpMetrics
}

// The directory calls pass through to the VQP's (fs asks for them by
// interface; an embedded fs.Conn would hide them).

func (c *meteredConn) FreshRegions(ctx context.Context, maxAge time.Duration) ([]fs.Region, error) {
	if fc, ok := c.Conn.(interface {
		FreshRegions(context.Context, time.Duration) ([]fs.Region, error)
	}); ok {
		return fc.FreshRegions(ctx, maxAge)
	}
	return c.Conn.Regions(ctx)
}

func (c *meteredConn) FreshRegion(ctx context.Context, name string, maxAge time.Duration) (fs.Region, error) {
	if fc, ok := c.Conn.(interface {
		FreshRegion(context.Context, string, time.Duration) (fs.Region, error)
	}); ok {
		return fc.FreshRegion(ctx, name, maxAge)
	}
	rs, err := c.Conn.Regions(ctx)
	if err != nil {
		return fs.Region{}, err
	}
	for _, r := range rs {
		if r.Name == name {
			return r, nil
		}
	}
	return fs.Region{}, fmt.Errorf("%w: %q", qpcore.ErrNoRegion, name)
}

func (c *meteredConn) FreshSize(ctx context.Context, name string, maxAge time.Duration) (int64, error) {
	if fc, ok := c.Conn.(interface {
		FreshSize(context.Context, string, time.Duration) (int64, error)
	}); ok {
		return fc.FreshSize(ctx, name, maxAge)
	}
	r, err := c.FreshRegion(ctx, name, maxAge)
	return r.Size, err
}

func (c *meteredConn) ReadAt(ctx context.Context, region string, p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := c.Conn.ReadAt(ctx, region, p, off)
	c.m.observe("read", c.Conn, start, n, err)
	return n, err
}

// ReadStart implements fs.ReadStarter; the READ is observed when waited for.
func (c *meteredConn) ReadStart(ctx context.Context, region string, p []byte, off int64) (fs.StartedRead, error) {
	rs, ok := c.Conn.(fs.ReadStarter)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	start := time.Now()
	r, err := rs.ReadStart(ctx, region, p, off)
	if err != nil {
		c.m.observe("read", c.Conn, start, 0, err)
		return nil, err
	}
	return &meteredRead{StartedRead: r, c: c, start: start}, nil
}

type meteredRead struct {
	fs.StartedRead
	c     *meteredConn
	start time.Time
}

func (r *meteredRead) Wait(ctx context.Context) (int, error) {
	n, err := r.StartedRead.Wait(ctx)
	r.c.m.observe("read", r.c.Conn, r.start, n, err)
	return n, err
}

func (c *meteredConn) WriteAt(ctx context.Context, region string, p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := c.Conn.WriteAt(ctx, region, p, off)
	c.m.observe("write", c.Conn, start, n, err)
	return n, err
}

func (c *meteredConn) FetchAdd(ctx context.Context, region string, off int64, d uint64) (uint64, error) {
	start := time.Now()
	v, err := c.Conn.FetchAdd(ctx, region, off, d)
	c.m.observe("fetch_add", c.Conn, start, 8, err)
	return v, err
}

func (c *meteredConn) CompareAndSwap(ctx context.Context, region string, off int64, cmp, swap uint64) (uint64, error) {
	start := time.Now()
	v, err := c.Conn.CompareAndSwap(ctx, region, off, cmp, swap)
	c.m.observe("compare_swap", c.Conn, start, 8, err)
	return v, err
}

func (c *meteredConn) Send(ctx context.Context, port uint32, msg []byte) error {
	start := time.Now()
	err := c.Conn.Send(ctx, port, msg)
	c.m.observe("send", c.Conn, start, len(msg), err)
	return err
}

// nodeCollector reads a node's counters at scrape time.
type nodeCollector struct {
	b *Node
}

type metricDesc struct {
	d *prometheus.Desc
	t prometheus.ValueType
}

func desc(name, help string, t prometheus.ValueType, labels ...string) metricDesc {
	return metricDesc{prometheus.NewDesc(metricsNS+"_"+name, help, labels, nil), t}
}

const (
	counter = prometheus.CounterValue
	gauge   = prometheus.GaugeValue
)

// coreMetric is a metric of qpcore's figures: its table row (which
// stats.json's Node object shows too) and its descriptor.
type coreMetric struct {
	qpcore.StatMetric
	desc metricDesc
}

var coreMetrics = func() []coreMetric {
	var out []coreMetric
	for _, m := range qpcore.StatMetrics() {
		t, labels := counter, []string(nil)
		if m.Gauge {
			t = gauge
		}
		if m.Label != "" {
			labels = []string{m.Label}
		}
		out = append(out, coreMetric{m, desc(m.Name, m.Help, t, labels...)})
	}
	return out
}()

var (
	mIOBuf     = desc("iobuf_bytes", "The filesystem's registered I/O buffers, by state (size: the whole pool; in_use: handed out now; peak: the most ever in use).", gauge, "state")
	mIOBufGets = desc("iobuf_gets_total", "READs of remote files served from the I/O buffers (ok) or, none being free, from go-fuse's buffer (overflow).", counter, "result")

	mNICPackets = desc("nic_packets_total", "Packets the NIC sent and received.", counter, "direction")
	mNICBytes   = desc("nic_bytes_total", "Bytes the NIC sent and received.", counter, "direction")
	mNICSys     = desc("nic_syscalls_total", "System calls the NIC made to send and receive.", counter, "direction")
	mNICDrops   = desc("nic_rx_dropped_total", "Received packets dropped, by reason (malformed, no_qp, dc_key, bad_mac).", counter, "reason")
	mNICTxErrs  = desc("nic_tx_errors_total", "Packets the NIC could not send, by reason (dropped: no room in the network's queue; refused: e.g. larger than the path MTU); the protocols retransmit them.", counter, "reason")
	mNICRxErrs  = desc("nic_rx_errors_total", "Receive calls that failed.", counter)
	mNICRetx    = desc("nic_retransmits_total", "Packets the NIC sent again.", counter)
	mNICMisplc  = desc("nic_misplaced_total", "Payload segments copied because receive steering guessed wrong.", counter)
	mNICWCopy   = desc("nic_write_copied_bytes_total", "WRITE payload bytes the software NIC copied into their target after checking the header.", counter)
	mNICQPs     = desc("nic_qps", "QPs on the NIC, by type and state.", gauge, "type", "state")
	mNICMRs     = desc("nic_mrs", "Memory regions registered on the NIC.", gauge)
	mNICMRBytes = desc("nic_mr_bytes", "Bytes of memory registered on the NIC.", gauge)
	mQPRetx     = desc("qp_retransmits_total", "Packets a QP sent again, per QP.", counter, "qpn", "type")
	mQPTimeouts = desc("qp_timeouts_total", "Retransmission timer expiries, per QP.", counter, "qpn", "type")
	mQPNAKs     = desc("qp_naks_total", "NAKs per QP, by kind (seq, rnr, err) and direction (sent, received).", counter, "qpn", "type", "kind", "direction")
	mQPErrs     = desc("qp_err_transitions_total", "Transitions of a QP to ERR, per QP.", counter, "qpn", "type")

	mAuthSessions   = desc("auth_sessions", "Authenticated sessions the NIC knows now (cluster key).", gauge)
	mAuthHandshakes = desc("auth_handshakes_total", "Authenticated sessions established, either role (cluster key).", counter)
	mAuthDrops      = desc("auth_dropped_total", "Received packets dropped by authentication, by reason (bad_tag, no_session, wrong_source, replayed, stale_init); their sum is nic_rx_dropped_total{reason=\"bad_mac\"}.", counter, "reason")
	mAuthParked     = desc("auth_parked_total", "Packets held for a session handshake, by result (parked, dropped: the queue was full).", counter, "result")
	mAuthEncrypted  = desc("auth_encrypted_bytes_total", "Payload bytes encrypted (--encrypt).", counter)
	mCMRecords      = desc("cm_records", "Connections accepted and not yet confirmed by their requester now.", gauge)
	mCMCookies      = desc("cm_cookies_sent_total", "Connection requests answered with a cookie instead of a connection (the requester must prove its address; without a cluster key).", counter)
	mCMBadCookies   = desc("cm_bad_cookies_total", "Connection requests whose cookie was stale or forged (also in cm_cookies_sent_total: they get a new one).", counter)
	mCMLimit        = desc("cm_limit_rejects_total", "Connection requests refused by the per-source or total limit of unconfirmed connections.", counter)

	mMeta = desc("meta_client_total", "Meta client events (lookup, cache_miss, read, torn_read, rpc, stray_reply, failover, connect, invalidation, busy).", counter, "event")

	mRegions     = desc("regions", "Regions this node exports.", gauge)
	mRegionBytes = desc("region_bytes", "Size of each exported region.", gauge, "region")
)

// Describe sends the descriptors of the metrics Collect emits (found by
// collecting once: no hand-kept list to forget a metric in).
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	emit := func(m metricDesc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(m.d, m.t, v, labels...)
	}
	u := func(v uint64) float64 { return float64(v) }
	b := c.b

	s := b.core.Stats()
	for _, m := range coreMetrics {
		for i := range m.Fields {
			f := &m.Fields[i]
			if m.Label == "" {
				emit(m.desc, f.Of(&s))
			} else {
				emit(m.desc, f.Of(&s), f.Value)
			}
		}
	}
	// Always emitted (zero without a mount): Describe collects once, at
	// registration, before the filesystem registers its buffers.
	var is fs.IOBufferStats
	if p := b.ioBufs.Load(); p != nil {
		is = p.Stats()
	}
	emit(mIOBuf, float64(is.Bytes), "size")
	emit(mIOBuf, float64(is.InUse), "in_use")
	emit(mIOBuf, float64(is.Peak), "peak")
	emit(mIOBufGets, u(is.Gets), "ok")
	emit(mIOBufGets, u(is.Overflows), "overflow")
	b.collectFuse(emit)

	d := b.dev.Stats()
	emit(mNICPackets, u(d.TxPackets), "tx")
	emit(mNICPackets, u(d.RxPackets), "rx")
	emit(mNICBytes, u(d.TxBytes), "tx")
	emit(mNICBytes, u(d.RxBytes), "rx")
	emit(mNICSys, u(d.TxSyscalls), "tx")
	emit(mNICSys, u(d.RxSyscalls), "rx")
	emit(mNICTxErrs, u(d.TxDropped), "dropped")
	emit(mNICTxErrs, u(d.TxErrors-min(d.TxDropped, d.TxErrors)), "refused")
	emit(mNICRxErrs, u(d.RxErrors))
	emit(mNICDrops, u(d.Malformed), "malformed")
	emit(mNICDrops, u(d.NoQP), "no_qp")
	emit(mNICDrops, u(d.DCKeyRejects), "dc_key")
	emit(mNICDrops, u(d.BadMAC), "bad_mac")
	emit(mNICDrops, u(d.BadVersion), "bad_version")
	emit(mNICRetx, u(d.Retransmits))
	emit(mNICMisplc, u(d.Misplaced))
	emit(mNICWCopy, u(d.WriteCopied))
	emit(mNICMRs, float64(d.MRs))
	emit(mNICMRBytes, u(d.MRBytes))

	type ts struct{ t, s string }
	byTS := map[ts]int{}
	for _, q := range b.dev.QPs() {
		byTS[ts{q.Type.String(), q.State.String()}]++
		qpn, typ := strconv.FormatUint(uint64(q.QPN), 10), q.Type.String()
		qs := q.Stats
		emit(mQPRetx, u(qs.Retransmits), qpn, typ)
		emit(mQPTimeouts, u(qs.Timeouts), qpn, typ)
		emit(mQPNAKs, u(qs.NAKSeqSent), qpn, typ, "seq", "sent")
		emit(mQPNAKs, u(qs.NAKSeqRx), qpn, typ, "seq", "received")
		emit(mQPNAKs, u(qs.RNRNAKSent), qpn, typ, "rnr", "sent")
		emit(mQPNAKs, u(qs.RNRNAKRx), qpn, typ, "rnr", "received")
		emit(mQPNAKs, u(qs.ErrNAKSent), qpn, typ, "err", "sent")
		emit(mQPNAKs, u(qs.ErrNAKRx), qpn, typ, "err", "received")
		emit(mQPErrs, u(qs.Errors), qpn, typ)
	}
	for k, n := range byTS {
		emit(mNICQPs, float64(n), k.t, k.s)
	}

	if sec, ok := b.securityStats(); ok {
		c.collectSecurity(sec, emit)
	}

	m := b.meta.Stats()
	for _, e := range []struct {
		ev string
		v  uint64
	}{{"lookup", m.Lookups}, {"cache_miss", m.CacheMisses}, {"read", m.Reads}, {"torn_read", m.TornReads},
		{"rpc", m.RPCs}, {"stray_reply", m.StrayReplies}, {"failover", m.Failovers}, {"connect", m.Connects},
		{"invalidation", m.Invalidated}, {"busy", m.Busy}} {
		emit(mMeta, u(e.v), e.ev)
	}

	regions := b.Regions()
	emit(mRegions, float64(len(regions)))
	for _, r := range regions {
		emit(mRegionBytes, float64(r.Size), r.Name)
	}
}

// collectSecurity emits the NIC's authentication counters (with a
// cluster key) and its connection manager's.
func (c *nodeCollector) collectSecurity(sec verbs.SecurityStats, emit func(metricDesc, float64, ...string)) {
	u := func(v uint64) float64 { return float64(v) }
	if sec.Keyed {
		a := sec.Auth
		emit(mAuthSessions, float64(a.Sessions))
		emit(mAuthHandshakes, u(a.Handshakes))
		for _, r := range []struct {
			reason string
			v      uint64
		}{{"bad_tag", a.BadTag}, {"no_session", a.NoSession}, {"wrong_source", a.WrongSource},
			{"replayed", a.Replayed}, {"stale_init", a.StaleInit}} {
			emit(mAuthDrops, u(r.v), r.reason)
		}
		emit(mAuthParked, u(a.Parked), "parked")
		emit(mAuthParked, u(a.ParkedDropped), "dropped")
		emit(mAuthEncrypted, u(a.Encrypted))
	}
	cm := sec.CM
	emit(mCMRecords, float64(cm.Records))
	emit(mCMCookies, u(cm.CookiesSent))
	emit(mCMBadCookies, u(cm.BadCookies))
	emit(mCMLimit, u(cm.LimitRejects))
}

// Registry holds every metric of node n, the operation metrics ops, and
// the Go runtime's.
func Registry(b *Node, ops *OpMetrics) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&nodeCollector{b: b})
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ops.register(reg)
	return reg
}
