package baseline

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Latencies are per-operation durations, in the order they were measured.
type Latencies []time.Duration

// Summary condenses latencies into the columns of perftest's latency
// tables (t_min, t_max, t_typical, t_avg, t_stdev, 99% and 99.9%
// percentiles).
type Summary struct {
	N       int
	Min     time.Duration
	Max     time.Duration
	Typical time.Duration // median; the mean of the two middle values when N is even
	Avg     time.Duration // arithmetic mean, truncated to the nanosecond
	Stdev   time.Duration // population standard deviation, rounded to the nanosecond
	P99     time.Duration // nearest-rank 99th percentile
	P999    time.Duration // nearest-rank 99.9th percentile
}

// Summary computes the summary of l. It does not reorder l. An empty l has
// the zero Summary.
//
// Percentiles use the nearest-rank definition: the p-th percentile of N
// sorted values is the value at 1-based rank ceil(p*N).
func (l Latencies) Summary() Summary {
	n := len(l)
	if n == 0 {
		return Summary{}
	}
	s := slices.Clone(l)
	slices.Sort(s)

	var sum float64
	for _, d := range s {
		sum += float64(d)
	}
	mean := sum / float64(n)
	var sq float64
	for _, d := range s {
		dev := float64(d) - mean
		sq += dev * dev
	}

	var typical time.Duration
	if n%2 == 1 {
		typical = s[n/2]
	} else {
		a, b := s[n/2-1], s[n/2]
		typical = a + (b-a)/2
	}
	var total time.Duration
	for _, d := range s {
		total += d
	}
	return Summary{
		N:       n,
		Min:     s[0],
		Max:     s[n-1],
		Typical: typical,
		Avg:     total / time.Duration(n),
		Stdev:   time.Duration(math.Round(math.Sqrt(sq / float64(n)))),
		P99:     s[nearestRank(n, 990)-1],
		P999:    s[nearestRank(n, 999)-1],
	}
}

// nearestRank returns ceil(n*perMille/1000), at least 1, in exact integer
// arithmetic (0.99*100 is not exactly 99 in floating point).
func nearestRank(n, perMille int) int {
	r := (n*perMille + 999) / 1000
	return max(r, 1)
}

// Usec formats d in microseconds with two decimals, as perftest prints
// latencies.
func Usec(d time.Duration) string {
	return fmt.Sprintf("%.2f", float64(d)/float64(time.Microsecond))
}

// LatencyHeader is the header line of perftest's latency tables; Row
// prints lines under it.
const LatencyHeader = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"

// Row formats s as a line of a perftest latency table for messages of the
// given size in bytes.
func (s Summary) Row(bytes int) string {
	return fmt.Sprintf(" %-7d %-10d %-14s %-14s %-16s %-14s %-15s %-22s %s",
		bytes, s.N, Usec(s.Min), Usec(s.Max), Usec(s.Typical), Usec(s.Avg),
		Usec(s.Stdev), Usec(s.P99), Usec(s.P999))
}

// String formats s on one line, in microseconds.
func (s Summary) String() string {
	return fmt.Sprintf("n=%d min=%s max=%s typical=%s avg=%s stdev=%s p99=%s p99.9=%s usec",
		s.N, Usec(s.Min), Usec(s.Max), Usec(s.Typical), Usec(s.Avg),
		Usec(s.Stdev), Usec(s.P99), Usec(s.P999))
}

// Number is what Ratio divides: durations, counts and rates.
type Number interface {
	~int | ~int64 | ~uint64 | ~float64
}

// Ratio returns a/b as a float64: for latencies, how many times slower a is
// than b (1.27 is 27% above the baseline b); for rates, how many times
// faster. A zero b gives +Inf, -Inf or NaN, as float64 division does.
func Ratio[T Number](a, b T) float64 {
	return float64(a) / float64(b)
}
