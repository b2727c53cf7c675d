package baseline

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// oneToHundred is 1, 2, ..., 100 us, shuffled so that Summary must sort.
func oneToHundred() Latencies {
	l := make(Latencies, 100)
	for i := range l {
		l[i] = time.Duration((i*37)%100+1) * time.Microsecond // 37 is coprime to 100
	}
	return l
}

func TestSummaryKnownInput(t *testing.T) {
	l := oneToHundred()
	orig := slices.Clone(l)
	got := l.Summary()
	// By hand, for 1..100 us:
	//   median of an even count = (50+51)/2 = 50.5 us; mean = 5050/100 = 50.5 us;
	//   population stdev = sqrt((100^2-1)/12) us = 28.86607 us -> 28866 ns;
	//   99th nearest rank = ceil(99.0) = 99 -> 99 us; 99.9th = ceil(99.9) = 100 -> 100 us.
	want := Summary{
		N:       100,
		Min:     1 * time.Microsecond,
		Max:     100 * time.Microsecond,
		Typical: 50500 * time.Nanosecond,
		Avg:     50500 * time.Nanosecond,
		Stdev:   28866 * time.Nanosecond,
		P99:     99 * time.Microsecond,
		P999:    100 * time.Microsecond,
	}
	if got != want {
		t.Errorf("Summary of 1..100 us:\n got  %+v\n want %+v", got, want)
	}
	if !slices.Equal(l, orig) {
		t.Error("Summary reordered its receiver")
	}
}

func TestSummaryOddCountAndPercentileRanks(t *testing.T) {
	got := Latencies{3, 1, 2}.Summary()
	if got.Typical != 2 || got.Min != 1 || got.Max != 3 || got.Avg != 2 {
		t.Errorf("Summary{3,1,2} = %+v, want typical 2, min 1, max 3, avg 2", got)
	}
	// Population stdev of {1,2,3} ns is sqrt(2/3) = 0.816 -> 1 ns.
	if got.Stdev != 1 {
		t.Errorf("stdev = %v, want 1ns", got.Stdev)
	}
	// With three values the 99th and 99.9th percentiles are the maximum.
	if got.P99 != 3 || got.P999 != 3 {
		t.Errorf("p99 %v p99.9 %v, want 3ns both", got.P99, got.P999)
	}

	// 1000 values 1..1000: p99 is rank 990, p99.9 is rank 999.
	l := make(Latencies, 1000)
	for i := range l {
		l[i] = time.Duration(1000 - i)
	}
	s := l.Summary()
	if s.P99 != 990 || s.P999 != 999 || s.Typical != 500 {
		t.Errorf("1..1000: p99 %d p99.9 %d typical %d, want 990 999 500", s.P99, s.P999, s.Typical)
	}
}

func TestSummaryEmptyAndSingle(t *testing.T) {
	if got := (Latencies{}).Summary(); got != (Summary{}) {
		t.Errorf("empty Summary = %+v, want zero", got)
	}
	d := 7 * time.Microsecond
	want := Summary{N: 1, Min: d, Max: d, Typical: d, Avg: d, P99: d, P999: d}
	if got := (Latencies{d}).Summary(); got != want {
		t.Errorf("single Summary = %+v, want %+v", got, want)
	}
}

func TestUsecAndFormatting(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0.00"},
		{10400 * time.Nanosecond, "10.40"},
		{1234567 * time.Nanosecond, "1234.57"},
		{5 * time.Nanosecond, "0.01"},
	} {
		if got := Usec(c.d); got != c.want {
			t.Errorf("Usec(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	s := oneToHundred().Summary()
	str := s.String()
	for _, part := range []string{"n=100", "min=1.00", "max=100.00", "typical=50.50", "stdev=28.87", "p99=99.00", "p99.9=100.00"} {
		if !strings.Contains(str, part) {
			t.Errorf("String() = %q lacks %q", str, part)
		}
	}
	row := strings.Fields(s.Row(64))
	wantRow := []string{"64", "100", "1.00", "100.00", "50.50", "50.50", "28.87", "99.00", "100.00"}
	if !slices.Equal(row, wantRow) {
		t.Errorf("Row(64) fields = %q, want %q", row, wantRow)
	}
	if !strings.Contains(LatencyHeader, "t_typical[usec]") {
		t.Errorf("LatencyHeader = %q", LatencyHeader)
	}
}

func TestRatio(t *testing.T) {
	if got := Ratio(13*time.Microsecond, 10*time.Microsecond); math.Abs(got-1.3) > 1e-12 {
		t.Errorf("Ratio(13us, 10us) = %v, want 1.3", got)
	}
	if got := Ratio(240e3, 120e3); got != 2 {
		t.Errorf("Ratio(240e3, 120e3) = %v, want 2", got)
	}
	if got := Ratio(1, 0); !math.IsInf(got, 1) {
		t.Errorf("Ratio(1, 0) = %v, want +Inf", got)
	}
}
