// Package baseline measures the reference numbers that krfs performance
// targets are stated against, in the same run as the thing being measured.
//
// # Why same-run baselines
//
// krfs is developed and tested on small shared virtual machines (2 vCPUs,
// no RDMA hardware) whose speed changes 2-4x from one run to the next. An
// absolute figure such as "a READ takes 14 us" means nothing across runs.
// So every performance claim in krfs is a ratio: krfs's figure divided by a
// baseline measured by this package in the same process, moments apart, on
// the same path (loopback unless told otherwise). A target then reads
// "sync READ p50 <= 1.3x UDPPingPong p50", which holds or fails the same
// way on a fast run and a slow one.
//
// # The baselines
//
// Each one is the cheapest way to do, without krfs, what a krfs operation
// must do at least:
//
//   - UDPPingPong: one request datagram and one response datagram between
//     two blocking sockets driven by raw sendto/recvfrom system calls. It is
//     the floor for a synchronous softnic operation (a one-sided READ or an
//     atomic is one request and one response). Raw syscalls are used because
//     Go's netpoller hands packets to a thread on the other vCPU, which adds
//     ~14 us per wake-up on these machines; a softnic that beats the net
//     package but not this baseline still has work to do.
//   - EchoRate: small request/response pairs per second with many requests
//     in flight, both sides batching with sendmmsg/recvmmsg. It is the
//     ceiling for asynchronous small operations (doorbell-batched READs).
//   - TCPBandwidth: bytes per second of msgSize responses to small requests
//     over one loopback TCP connection — how a kernel stream would serve a
//     one-sided READ of msgSize bytes. It is the reference for bulk READ
//     and WRITE throughput.
//   - TCPConnectRoundTrip: dial, accept and one round trip on a new TCP
//     connection — what a conventional per-peer connection costs before
//     the first byte of data. KRCORE's point is that opening a VQP to a new
//     peer costs far less than this.
//
// Latency baselines return Latencies, one duration per round trip; their
// Summary has the columns of perftest's latency tables. Rate baselines
// return a plain float64 (operations or bytes per second). Ratio divides
// either kind.
//
// # Using them from benchmarks
//
// Measure the baseline inside the benchmark, next to the measured code, and
// report the ratio as a metric:
//
//	func BenchmarkReadSync(b *testing.B) {
//		base, err := baseline.UDPPingPong(2000, 64)
//		if err != nil {
//			b.Fatal(err)
//		}
//		lat := make(baseline.Latencies, 0, b.N)
//		for range b.N {
//			t0 := time.Now()
//			// ... one synchronous 64-byte READ ...
//			lat = append(lat, time.Since(t0))
//		}
//		got, ref := lat.Summary(), base.Summary()
//		b.ReportMetric(got.Typical.Seconds()*1e6, "p50-us")
//		b.ReportMetric(baseline.Ratio(got.Typical, ref.Typical), "p50-x-baseline")
//	}
//
// Run baselines one at a time and not concurrently with the code under test:
// with two vCPUs, anything running beside a measurement is part of it. On a
// machine whose speed drifts within seconds, interleave them instead of
// measuring one block after the other: Alternate runs the code under test
// and the ping-pong in alternating chunks, AlternateWith does the same with
// any baseline (a ping-pong to a RemoteServer's echo, preads of a FUSE
// floor's file). Pass LocalRounds(n) to Alternate, RemoteRounds(n)
// (chunks of ChunkOps operations) to AlternateWith with a server in
// another process, and start each chunk of the code under test with
// Warmup untimed operations, as every baseline chunk does; AlternateWith's
// doc has the A/A tests behind the choice.
//
// # Addresses
//
// The package-level functions use 127.0.0.1. Host runs the same baselines
// on another local address, for example inside a network namespace whose
// loopback is down. Both ends always live in this process, so traffic to a
// local address is looped back by the kernel whatever interface owns it;
// these are loopback figures, never a measurement of a veth or a wire.
//
// # Resources
//
// Every baseline opens its own sockets and server goroutine and closes them
// all before it returns, on success and on error.
package baseline
