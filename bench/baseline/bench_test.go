package baseline

import (
	"fmt"
	"testing"
	"time"
)

// The benchmarks print the baselines themselves, so that `make bench`
// output carries the reference numbers of its own run.

func reportLatency(b *testing.B, l Latencies) {
	s := l.Summary()
	b.ReportMetric(float64(s.Typical)/1e3, "p50-us")
	b.ReportMetric(float64(s.P99)/1e3, "p99-us")
}

func BenchmarkUDPPingPong64(b *testing.B) {
	l, err := UDPPingPong(b.N, 64)
	if err != nil {
		b.Fatal(err)
	}
	reportLatency(b, l)
}

func BenchmarkTCPConnectRoundTrip(b *testing.B) {
	l, err := TCPConnectRoundTrip(b.N)
	if err != nil {
		b.Fatal(err)
	}
	reportLatency(b, l)
}

// Each iteration is one 200 ms window; the metric is the mean rate.
func BenchmarkEchoRate64x32(b *testing.B) {
	var sum float64
	for range b.N {
		r, err := EchoRate(32, 64, 200*time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		sum += r
	}
	b.ReportMetric(sum/float64(b.N), "ops/s")
}

// Each iteration is one 1 MiB response; ns/op and MB/s include the
// connection's setup, amortized over b.N.
func BenchmarkTCPBandwidth1MiB(b *testing.B) {
	for _, depth := range []int{1, 4} {
		b.Run(fmt.Sprintf("depth%d", depth), func(b *testing.B) {
			b.SetBytes(1 << 20)
			bw, err := Loopback.TCPBandwidth(1<<20, int64(b.N)<<20, depth)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(bw/1e9, "timed-GB/s") // without the setup
		})
	}
}
