package bench

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/krfs/krfs/bench/baseline"
)

// Target is what a benchmark runs against: a VQP to a peer (API
// mode) or a file of a mounted krfs (file mode). Buffers come from buf,
// which returns the i-th of the target's buffers (page-aligned in file
// mode, registered in API mode), at least size bytes long.
type Target interface {
	describe() string
	// limit is the size of the region at offset 0, or 0 when unknown or
	// not a region (ports).
	limit() int64
	buf(i, size int) []byte
	read(p []byte) error
	write(p []byte) error
	fetchAdd() error
	send(p []byte) error
	// stream runs n operations of size bytes (or until deadline, when it
	// is not zero) with outstanding in flight, from buffers 0..outstanding-1,
	// calling done once per completed operation.
	stream(write bool, size, n, outstanding int, deadline time.Time, done func()) error
	// variants and once are the connect and meta_lookup tests.
	variants(test string) []string
	once(test, variant string) (time.Duration, error)
	close() error
}

// runBenchTest runs o.Test against t.
func runBenchTest(o *Opts, t Target, p *Progress) (*Report, error) {
	r := &Report{Test: o.Test, Mode: o.Mode(), Target: t.describe(), Outstanding: o.Outstanding}
	var deadline func() time.Time
	if o.Duration > 0 {
		d := time.Duration(o.Duration * float64(time.Second))
		deadline = func() time.Time { return time.Now().Add(d) }
	}
	// frac is the fraction done of one size, for the progress bar.
	frac := func(k, n int, start time.Time) float64 {
		if o.Duration > 0 {
			return time.Since(start).Seconds() / o.Duration
		}
		return float64(k) / float64(n)
	}
	lim := t.limit()
	sizes := o.Sizes()
	for si, size := range sizes {
		if lim > 0 && int64(size) > lim {
			r.Notes = append(r.Notes, fmt.Sprintf("%d bytes skipped: the region holds %d", size, lim))
			continue
		}
		label := o.Test
		if len(sizes) > 1 {
			label = fmt.Sprintf("%s %d/%d (%d B)", o.Test, si+1, len(sizes), size)
		}
		p.begin(label)
		n := o.ItersFor(size)
		switch {
		case o.IsLat():
			b := t.buf(0, size)[:size]
			op := map[string]func() error{
				"read_lat":   func() error { return t.read(b) },
				"write_lat":  func() error { return t.write(b) },
				"atomic_lat": t.fetchAdd,
				"send_lat":   func() error { return t.send(b) },

				"fuse_noop_lat": func() error { return t.read(b) },
			}[o.Test]
			for range min(n, 10) { // warm up: first touch, registration, directory
				if err := op(); err != nil {
					return nil, fmt.Errorf("%s of %d bytes: %w", o.Test, size, err)
				}
			}
			base, err := o.latBaseline(size)
			if err != nil {
				return nil, err
			}
			var lat, bl baseline.Latencies
			if base != nil && deadline == nil {
				lat, bl, err = alternate(n, op, base, func(k int, start time.Time) { p.update(frac(k, n, start)) })
			} else {
				lat, err = timeLoop(n, deadline, op, func(k int, start time.Time) { p.update(frac(k, n, start)) })
				if err == nil && base != nil { // -D: the baseline after ours
					bl, err = base.measure(min(max(len(lat), 200), 5000))
				}
			}
			if err != nil {
				return nil, fmt.Errorf("%s of %d bytes: %w", o.Test, size, err)
			}
			row := NewLatRow("", size, lat)
			r.AddLat(LatTitle(o.Test), row)
			if base != nil {
				bs := bl.Summary()
				r.Baselines = append(r.Baselines, BaseRow{Bytes: size, Name: base.name, Unit: "usec",
					Krfs: row.TypicalUs, Baseline: us(bs.Typical), Ratio: ratio(row.TypicalUs, us(bs.Typical))})
			}
		case o.IsBW():
			for i := range o.Outstanding {
				t.buf(i, size)
			}
			// Warm up every buffer once.
			if err := t.stream(o.Test == "write_bw", size, o.Outstanding, o.Outstanding, time.Time{}, func() {}); err != nil {
				return nil, fmt.Errorf("%s of %d bytes: %w", o.Test, size, err)
			}
			var dl time.Time
			if deadline != nil {
				dl = deadline()
			}
			done := make([]time.Duration, 0, min(n, 1<<22))
			start := time.Now()
			err := t.stream(o.Test == "write_bw", size, n, o.Outstanding, dl, func() {
				done = append(done, time.Since(start))
				if len(done)%64 == 0 {
					p.update(frac(len(done), n, start))
				}
			})
			if err != nil {
				return nil, fmt.Errorf("%s of %d bytes: %w", o.Test, size, err)
			}
			row := newBWRow(size, done, o.Outstanding)
			r.Bandwidth = append(r.Bandwidth, row)
			if o.Baseline {
				if err := bwBaseline(r, o, row); err != nil {
					return nil, err
				}
			}
		default: // connect, meta_lookup
			pair, err := o.coldPair()
			if err != nil {
				return nil, err
			}
			if pair != nil {
				defer pair.Close()
			}
			var pairLat baseline.Latencies
			for _, v := range t.variants(o.Test) {
				if _, err := t.once(o.Test, v); err != nil { // warm up
					return nil, fmt.Errorf("%s %s: %w", o.Test, v, err)
				}
				var lat baseline.Latencies
				start := time.Now()
				var end time.Time
				if deadline != nil {
					end = deadline()
				}
				for k := 0; ; k++ {
					if (end.IsZero() && k >= n) || (!end.IsZero() && !time.Now().Before(end)) {
						break
					}
					d, err := t.once(o.Test, v)
					if err != nil {
						return nil, fmt.Errorf("%s %s: %w", o.Test, v, err)
					}
					lat = append(lat, d)
					if pair != nil && v == "cold+read8" {
						// The floor's pattern right after, so that
						// both see the machine in the same state.
						b, err := pair.Once()
						if err != nil {
							return nil, fmt.Errorf("baseline: %w", err)
						}
						pairLat = append(pairLat, b)
					}
					p.update(frac(k, n, start))
				}
				r.AddLat(fmt.Sprintf("%s: %s", o.Test, v), NewLatRow(v, 0, lat))
			}
			if len(pairLat) > 0 {
				b := us(pairLat.Summary().Typical)
				for _, tb := range r.Tables {
					if row := tb.Rows[0]; row.Label == "cold+read8" {
						r.Baselines = append(r.Baselines, BaseRow{Name: "udp meta+peer round trips p50 (" + o.BaselineMetaEcho + ", " + o.BaselineEcho + ") vs cold+read8",
							Unit: "usec", Krfs: row.TypicalUs, Baseline: b, Ratio: ratio(row.TypicalUs, b)})
					}
				}
			}
			if o.Baseline && o.Test == "connect" && pair == nil {
				bl, err := baseline.TCPConnectRoundTrip(min(max(n, 200), 2000))
				if err != nil {
					return nil, fmt.Errorf("baseline: %w", err)
				}
				b := us(bl.Summary().Typical)
				for _, tb := range r.Tables {
					k := tb.Rows[0].TypicalUs
					r.Baselines = append(r.Baselines, BaseRow{Name: "tcp connect+rtt p50 vs " + tb.Rows[0].Label, Unit: "usec", Krfs: k, Baseline: b, Ratio: ratio(k, b)})
				}
			}
			if o.Test == "meta_lookup" && len(r.Tables) == 2 {
				a, b := r.Tables[0].Rows[0].TypicalUs, r.Tables[1].Rows[0].TypicalUs
				r.Baselines = append(r.Baselines, BaseRow{Name: "one-sided p50 vs rpc p50", Unit: "usec", Krfs: a, Baseline: b, Ratio: ratio(a, b)})
			}
		}
		p.end()
	}
	return r, nil
}

// coldPair is connect's cold-pair baseline (--baseline-meta-echo), from
// the bench node's own address; nil without one.
func (o *Opts) coldPair() (*baseline.ColdPair, error) {
	if o.BaselineMetaEcho == "" {
		return nil, nil
	}
	meta, err := netip.ParseAddrPort(o.BaselineMetaEcho)
	if err != nil {
		return nil, fmt.Errorf("--baseline-meta-echo %q: %w", o.BaselineMetaEcho, err)
	}
	peer, err := netip.ParseAddrPort(o.BaselineEcho)
	if err != nil {
		return nil, fmt.Errorf("--baseline-echo %q: %w", o.BaselineEcho, err)
	}
	h := baseline.Loopback
	if l, err := netip.ParseAddrPort(o.Listen); err == nil {
		h = baseline.Host{Addr: l.Addr()}
	}
	return h.NewColdPair(meta, peer)
}

// latBase is a latency test's baseline.
type latBase struct {
	measure func(k int) (baseline.Latencies, error) // times k of its operations
	name    string
	// rounds is how many rounds to alternate n operations of each side
	// in: baseline.RemoteRounds for a server in another process,
	// baseline.LocalRounds for the ping-pong with its echo in this one.
	rounds func(n int) int
}

// latBaseline is the baseline of a latency test of size bytes; nil when o
// asks for none or none fits size.
func (o *Opts) latBaseline(size int) (*latBase, error) {
	switch {
	case !o.Baseline:
		return nil, nil
	case o.BaselineFloor != "":
		path := o.BaselineFloor
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return nil, fmt.Errorf("--baseline-floor %s: %w", path, err)
		}
		if int64(size) > st.Size {
			return nil, nil
		}
		return &latBase{
			measure: func(k int) (baseline.Latencies, error) { return baseline.PreadLatency(path, k, size) },
			name:    "floor pread p50",
			rounds:  baseline.RemoteRounds,
		}, nil
	case size > baseline.MaxUDPSize:
		return nil, nil
	case o.BaselineEcho != "":
		echo, err := netip.ParseAddrPort(o.BaselineEcho)
		if err != nil {
			return nil, fmt.Errorf("--baseline-echo %q: %w", o.BaselineEcho, err)
		}
		// The unspecified address: the kernel picks the source on the
		// route to the echo, as it does for the peer.
		h := baseline.Host{Addr: netip.IPv4Unspecified()}
		if echo.Addr().Is6() {
			h.Addr = netip.IPv6Unspecified()
		}
		return &latBase{
			measure: func(k int) (baseline.Latencies, error) { return h.UDPPingPongTo(echo, k, size) },
			name:    "udp_pingpong p50 (echo " + o.BaselineEcho + ")",
			rounds:  baseline.RemoteRounds,
		}, nil
	}
	return &latBase{
		measure: func(k int) (baseline.Latencies, error) { return baseline.UDPPingPong(k, size) },
		name:    "udp_pingpong p50",
		rounds:  baseline.LocalRounds,
	}, nil
}

// LatTitle is the title of the latency table of test.
func LatTitle(test string) string {
	return map[string]string{
		"read_lat":   "READ latency (synchronous, 1 outstanding)",
		"write_lat":  "WRITE latency (synchronous, 1 outstanding)",
		"atomic_lat": "FETCH_ADD latency (synchronous, 1 outstanding)",
		"send_lat":   "SEND latency (until delivered, 1 outstanding)",

		"fuse_noop_lat": "pread of an in-memory go-fuse file (no network; the FUSE floor)",
	}[test]
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return math.Round(a/b*1000) / 1000
}

// alternate times n operations op and n of the baseline base in
// alternating chunks (baseline.AlternateWith, base.rounds(n) rounds).
// Each chunk of op starts with baseline.Warmup untimed operations, as each
// of the baseline's does, so that neither side alone pays for the switch.
// prog reports progress (k of n operations done).
func alternate(n int, op func() error, base *latBase, prog func(k int, start time.Time)) (lat, bl baseline.Latencies, err error) {
	bl, err = baseline.AlternateWith(base.rounds(n), n, func(k int) error {
		for range baseline.Warmup {
			if err := op(); err != nil {
				return err
			}
		}
		done := len(lat)
		l, err := timeLoop(k, nil, op, func(j int, start time.Time) { prog(done+j, start) })
		lat = append(lat, l...)
		return err
	}, base.measure)
	return lat, bl, err
}

// timeLoop times n calls of op (or calls until the deadline), reporting
// progress every 64 calls.
func timeLoop(n int, deadline func() time.Time, op func() error, prog func(k int, start time.Time)) (baseline.Latencies, error) {
	var end time.Time
	if deadline != nil {
		end = deadline()
	}
	lat := make(baseline.Latencies, 0, min(n, 1<<22))
	start := time.Now()
	for k := 0; ; k++ {
		if end.IsZero() && k >= n {
			break
		}
		if !end.IsZero() && k%16 == 0 && !time.Now().Before(end) {
			break
		}
		t0 := time.Now()
		if err := op(); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
		if prog != nil && k%64 == 0 {
			prog(k, start)
		}
	}
	return lat, nil
}

func bwBaseline(r *Report, o *Opts, row BWRow) error {
	if row.Bytes <= 4096 && o.Outstanding > 1 && row.Bytes <= baseline.MaxUDPSize {
		rate, err := baseline.EchoRate(o.Outstanding, row.Bytes, 300*time.Millisecond)
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		k := row.MsgRateMpps * 1e3
		b := rate / 1e3
		r.Baselines = append(r.Baselines, BaseRow{Bytes: row.Bytes, Name: fmt.Sprintf("sendmmsg echo x%d rate", o.Outstanding), Unit: "kops/s", Krfs: k, Baseline: b, Ratio: ratio(k, b)})
		return nil
	}
	total := min(int64(row.Bytes)*int64(row.Iterations), 512<<20)
	total = max(total, int64(row.Bytes)*16)
	bps, err := baseline.Loopback.TCPBandwidth(row.Bytes, total, o.Outstanding)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	b := bps / (1 << 20)
	r.Baselines = append(r.Baselines, BaseRow{Bytes: row.Bytes, Name: fmt.Sprintf("tcp bandwidth depth %d", o.Outstanding), Unit: "MiB/s", Krfs: row.AvgMiBs, Baseline: b, Ratio: ratio(row.AvgMiBs, b)})
	return nil
}

// Main runs the benchmark o describes (validated) and writes its report
// to stdout, a progress bar to stderr: all of `krfs bench` but the flags.
func Main(o *Opts, stdout, stderr io.Writer) error {
	var t Target
	var err error
	if o.Test == "fuse_noop_lat" {
		size := slices.Max(o.Sizes())
		path, unmount, err := mountNoop(size)
		if err != nil {
			return err
		}
		defer unmount()
		o.Path = path
	}
	if o.APIMode() {
		t, err = openAPITarget(o)
	} else {
		t, err = openFileTarget(o)
	}
	if err != nil {
		return err
	}
	defer t.close()
	r, err := runBenchTest(o, t, NewProgress(stderr, o.Progress))
	if err != nil {
		return err
	}
	if a, ok := t.(*apiTarget); ok && a.v != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("VQP transport at the end: %v", a.v.Transport()))
	}
	return r.Write(stdout, o.JSON)
}
