package baseline_test

import (
	"fmt"
	"time"

	"github.com/krfs/krfs/bench/baseline"
)

// A latency target is checked as a ratio against a baseline measured in
// the same run.
func Example() {
	base, err := baseline.UDPPingPong(1000, 64)
	if err != nil {
		panic(err)
	}
	ref := base.Summary()

	var lat baseline.Latencies
	for range 1000 {
		t0 := time.Now()
		// ... the operation under test, e.g. one synchronous 64-byte READ ...
		lat = append(lat, time.Since(t0))
	}
	got := lat.Summary()

	fmt.Println(baseline.LatencyHeader)
	fmt.Println(got.Row(64))
	fmt.Printf("p50 is %.2fx the UDP ping-pong p50\n", baseline.Ratio(got.Typical, ref.Typical))
}
