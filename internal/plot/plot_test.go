package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestWriteSVGWellFormed(t *testing.T) {
	c := Chart{Title: "READ latency <8B..1M>", XLabel: "bytes", YLabel: "usec", LogX: true, LogY: true, Pow2X: true,
		Series: []Series{
			{Name: "api", X: []float64{8, 64, 4096, 1 << 20}, Y: []float64{12, 13, 20, 400}},
			{Name: "fuse & co", X: []float64{8, 64, 4096, 1 << 20}, Y: []float64{25, 26, 30, 600}},
		}}
	var buf bytes.Buffer
	if err := c.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	// Well-formed XML, escaped text.
	d := xml.NewDecoder(strings.NewReader(out))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not XML: %v\n%s", err, out)
		}
	}
	for _, want := range []string{"&lt;8B..1M&gt;", "fuse &amp; co", "<polyline", ">1M<", ">1K<"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	if n := strings.Count(out, "<polyline"); n != 2 {
		t.Errorf("%d polylines, want 2", n)
	}
	// Deterministic.
	var again bytes.Buffer
	c.WriteSVG(&again)
	if again.String() != out {
		t.Error("output differs between runs")
	}
}

func TestWriteSVGLinearAndSinglePoint(t *testing.T) {
	for _, c := range []Chart{
		{Series: []Series{{Name: "a", X: []float64{1000, 5000, 10000}, Y: []float64{6.3, 10.4, 10.3}}}},
		{Series: []Series{{Name: "one", X: []float64{240}, Y: []float64{84}}}},
		{LogX: true, LogY: true, Series: []Series{{Name: "narrow", X: []float64{3, 4}, Y: []float64{5, 6}}}},
	} {
		var buf bytes.Buffer
		if err := c.WriteSVG(&buf); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(buf.String(), "NaN") {
			t.Errorf("NaN in output:\n%s", buf.String())
		}
	}
}

func TestWriteSVGErrors(t *testing.T) {
	var buf bytes.Buffer
	if err := (Chart{}).WriteSVG(&buf); !errors.Is(err, ErrNoData) {
		t.Errorf("empty chart: %v", err)
	}
	if err := (Chart{LogY: true, Series: []Series{{X: []float64{1}, Y: []float64{0}}}}).WriteSVG(&buf); err == nil {
		t.Error("zero on a log axis accepted")
	}
	if err := (Chart{Series: []Series{{X: []float64{1, 2}, Y: []float64{0}}}}).WriteSVG(&buf); err == nil {
		t.Error("mismatched series accepted")
	}
}

func TestLabel(t *testing.T) {
	for v, want := range map[float64]string{8: "8", 1024: "1K", 1 << 20: "1M", 1536: "1.5K", 0.5: "0.5", 12345: "12345", 2000: "2000", 1.5e9: "1.5e+09", 2.25: "2.25"} {
		if got := Label(v); got != want {
			t.Errorf("Label(%v) = %q, want %q", v, got, want)
		}
	}
}
