// Package plot writes small SVG line charts, enough for krfs's benchmark
// reports: one or more series of (x, y) points on linear or base-2/10
// logarithmic axes, with ticks, axis labels and a legend. It has no
// dependencies and produces deterministic output for the same input.
package plot

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Chart is a line chart. LogX and LogY draw that axis logarithmically
// (every value on it must then be positive); Pow2X puts a logarithmic X
// axis's ticks at powers of two (for message sizes) instead of ten.
type Chart struct {
	Title, XLabel, YLabel string
	LogX, LogY, Pow2X     bool
	Width, Height         int // pixels; 0 means 640x400
	Series                []Series
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// ErrNoData is returned by WriteSVG for a chart with no points.
var ErrNoData = errors.New("plot: no data")

type axis struct {
	log      bool
	base     float64 // of the ticks of a log axis
	lo, hi   float64 // in transformed space
	from, to float64 // pixels
}

func (a axis) tr(v float64) float64 {
	if a.log {
		return math.Log10(v)
	}
	return v
}

func (a axis) pos(v float64) float64 {
	t := a.tr(v)
	if a.hi == a.lo {
		return (a.from + a.to) / 2
	}
	return a.from + (t-a.lo)/(a.hi-a.lo)*(a.to-a.from)
}

// ticks returns tick values (untransformed) covering the axis.
func (a axis) ticks() []float64 {
	var out []float64
	if a.log {
		base := a.base
		if base == 0 {
			base = 10
		}
		lb := math.Log10(base)
		lo, hi := math.Floor(a.lo/lb), math.Ceil(a.hi/lb)
		step := 1.0
		for _, st := range []float64{1, 2, 5, 10, 20} {
			if step = st; (hi-lo)/st <= 8 {
				break
			}
		}
		for e := math.Ceil(lo/step) * step; e <= hi+1e-9; e += step {
			v := math.Pow(base, e)
			if t := a.tr(v); t >= a.lo-1e-9 && t <= a.hi+1e-9 {
				out = append(out, v)
			}
		}
		if len(out) >= 3 || base != 10 {
			return out
		}
		// Few decades: more ticks per decade.
		for _, ms := range [][]float64{{1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
			out = out[:0]
			for e := math.Floor(a.lo); e <= math.Ceil(a.hi); e++ {
				for _, m := range ms {
					v := m * math.Pow(10, e)
					if t := a.tr(v); t >= a.lo-1e-9 && t <= a.hi+1e-9 {
						out = append(out, v)
					}
				}
			}
			if len(out) >= 3 {
				break
			}
		}
		return out
	}
	span := a.hi - a.lo
	if span <= 0 {
		return []float64{a.lo}
	}
	raw := span / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	for v := math.Ceil(a.lo/step) * step; v <= a.hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

// Label formats a tick value compactly: 1024 -> 1K, 1536 -> 1.5K,
// 1048576 -> 1M for multiples of a quarter K, M or G, otherwise up to 3
// significant digits.
func Label(v float64) string {
	if v >= 1024 && v == math.Trunc(v) {
		for _, u := range []struct {
			s string
			m float64
		}{{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
			if v >= u.m && v/u.m < 1024 && math.Mod(v*4, u.m) == 0 {
				return fmt.Sprintf("%g%s", v/u.m, u.s)
			}
		}
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e7 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func bounds(vals []float64, log bool) (lo, hi float64, err error) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, 0, fmt.Errorf("plot: value %v cannot be drawn", v)
		}
		if log {
			if v <= 0 {
				return 0, 0, fmt.Errorf("plot: value %v on a logarithmic axis", v)
			}
			v = math.Log10(v)
		}
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if !log && lo > 0 && lo < hi/2 {
		lo = 0 // linear axes of positive data start at zero when it costs little
	}
	// A margin so that points do not sit on the frame.
	pad := (hi - lo) * 0.04
	if pad == 0 {
		pad = math.Max(math.Abs(hi)*0.1, 0.5)
		if log {
			pad = 0.1
		}
	}
	if !log && lo == 0 {
		return lo, hi + pad, nil
	}
	return lo - pad, hi + pad, nil
}

// WriteSVG draws c on w.
func (c Chart) WriteSVG(w io.Writer) error {
	width, height := c.Width, c.Height
	if width <= 0 || height <= 0 {
		width, height = 640, 400
	}
	var xs, ys []float64
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("plot: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		xs, ys = append(xs, s.X...), append(ys, s.Y...)
	}
	if len(xs) == 0 {
		return ErrNoData
	}
	xlo, xhi, err := bounds(xs, c.LogX)
	if err != nil {
		return err
	}
	ylo, yhi, err := bounds(ys, c.LogY)
	if err != nil {
		return err
	}
	const left, right, top, bottom = 70, 20, 40, 55
	xa := axis{log: c.LogX, base: 10, lo: xlo, hi: xhi, from: left, to: float64(width - right)}
	if c.Pow2X {
		xa.base = 2
	}
	ya := axis{log: c.LogY, lo: ylo, hi: yhi, from: float64(height - bottom), to: top}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" text-anchor="middle" font-size="15">%s</text>`+"\n", width/2, html.EscapeString(c.Title))
	// Grid and ticks.
	for _, t := range xa.ticks() {
		x := xa.pos(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, height-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, height-bottom+16, Label(t))
	}
	for _, t := range ya.ticks() {
		y := ya.pos(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, width-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, Label(t))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>`+"\n", left, top, width-left-right, height-top-bottom)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (left+width-right)/2, height-12, html.EscapeString(c.XLabel))
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n", (top+height-bottom)/2, (top+height-bottom)/2, html.EscapeString(c.YLabel))
	// Lines, points and the legend.
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		var pts []string
		for k := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xa.pos(s.X[k]), ya.pos(s.Y[k])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		for _, p := range pts {
			xy := strings.SplitN(p, ",", 2)
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], col)
		}
		ly := top + 14 + 16*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", left+10, ly-4, left+30, ly-4, col)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", left+36, ly, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err = io.WriteString(w, b.String())
	return err
}
