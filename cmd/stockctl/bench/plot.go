package bench

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
)

// The plot's geometry, in SVG user units (pixels).
const (
	plotWidth   = 900
	plotHeight  = 520
	plotLeft    = 80  // room for the y labels
	plotRight   = 300 // room for the legend
	plotTop     = 50
	plotBottom  = 60
	plotPadding = 0.06 // share of the x range left empty on each side
)

// palette gives each strategy line its colour, in the order lines appear.
var palette = []string{"#d62728", "#ff7f0e", "#1f77b4", "#17becf", "#9467bd", "#8c564b", "#2ca02c", "#e377c2", "#7f7f7f"}

// WriteSVG draws orders/s against segment count (both axes logarithmic) as
// a standalone SVG document headed by title: a colour per strategy, a
// marker per buyer count, a line through each strategy's runs at one buyer
// count, and the ideal of the step strategies dashed.
//
// The buyer count is either the count itself or the count per segment,
// whichever makes fewer lines: a run of 2 buyers per segment at 1, 20 and
// 100 segments is one line, and so is 200 buyers at 20 and 100 segments.
// The legend says which.
func WriteSVG(w io.Writer, rows []Row, title string) error {
	var names []string
	var segs []int
	step := map[string]bool{} // strategies with a business step
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		step[r.Strategy] = step[r.Strategy] || r.StepMs > 0
		if !slices.Contains(names, r.Strategy) {
			names = append(names, r.Strategy)
		}
		if !slices.Contains(segs, r.Segments) {
			segs = append(segs, r.Segments)
		}
		for _, v := range []float64{r.OrdersPerSec, r.IdealPerSec} {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	slices.Sort(segs)
	groupOf, groups, groupLabel := buyerGroups(rows)
	if len(segs) == 0 || math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	// y: whole decades around the data.
	yLo, yHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yHi <= yLo {
		yHi = yLo + 1
	}
	// x: log of the segment count, padded.
	xLo, xHi := 0.0, 1.0
	if len(segs) > 0 {
		xLo, xHi = math.Log10(float64(segs[0])), math.Log10(float64(segs[len(segs)-1]))
	}
	if xHi-xLo < 1e-9 {
		xLo, xHi = xLo-0.5, xHi+0.5
	}
	pad := (xHi - xLo) * plotPadding
	xLo, xHi = xLo-pad, xHi+pad
	iw, ih := float64(plotWidth-plotLeft-plotRight), float64(plotHeight-plotTop-plotBottom)
	px := func(n int) float64 { return plotLeft + (math.Log10(float64(n))-xLo)/(xHi-xLo)*iw }
	py := func(v float64) float64 { return plotTop + ih - (math.Log10(v)-yLo)/(yHi-yLo)*ih }

	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n",
		plotWidth, plotHeight, plotWidth, plotHeight)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="28" font-size="16" font-weight="bold">%s</text>`+"\n", plotLeft, html.EscapeString(title))
	// Grid and y labels: every decade, with 2× and 5× minor lines.
	for d := yLo; d <= yHi; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > yHi+1e-9 {
				break
			}
			y := py(v)
			stroke := "#eeeeee"
			if m == 1 {
				stroke = "#cccccc"
				p(`<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", plotLeft-8, y, humanRate(v))
			}
			p(`<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", plotLeft, y, plotLeft+iw, y, stroke)
		}
	}
	for _, n := range segs {
		x := px(n)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eeeeee"/>`+"\n", x, plotTop, x, plotTop+ih)
		p(`<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x, plotTop+ih+20, n)
	}
	p(`<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#333333"/>`+"\n", plotLeft, plotTop, iw, ih)
	p(`<text x="%.1f" y="%d" text-anchor="middle">segments</text>`+"\n", plotLeft+iw/2, plotHeight-15)
	p(`<text transform="translate(20 %.1f) rotate(-90)" text-anchor="middle">orders/s (log scale)</text>`+"\n", plotTop+ih/2)

	legendX, legendY := float64(plotWidth-plotRight+20), plotTop+10
	legend := func(color, dash, label string) {
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2.5"%s/>`+"\n", legendX, legendY, legendX+28, legendY, color, dash)
		p(`<text x="%.1f" y="%d" dominant-baseline="middle">%s</text>`+"\n", legendX+36, legendY, html.EscapeString(label))
		legendY += 22
	}
	// The ideal of the segmented step strategies: segments ÷ step.
	var ideal [][2]float64
	for _, n := range segs {
		for _, r := range rows {
			if r.Segments == n && r.IdealPerSec > 0 && r.Places == n {
				ideal = append(ideal, [2]float64{px(n), py(r.IdealPerSec)})
				break
			}
		}
	}
	if len(ideal) > 0 {
		p(`<polyline fill="none" stroke="#000000" stroke-width="1.5" stroke-dasharray="6 4" points="%s"/>`+"\n", points(ideal))
		legend("#000000", ` stroke-dasharray="6 4"`, "ideal (segments ÷ step)")
	}
	for i, name := range names {
		color := palette[i%len(palette)]
		// Pure allocation (no step, no ideal) is dotted: it is not the
		// same work as the lines with a step.
		dash, label := "", name
		if !step[name] {
			dash, label = ` stroke-dasharray="2 4"`, name+" (no step)"
		}
		drawn := false
		for g := range groups {
			var pts [][2]float64
			for _, n := range segs {
				for _, r := range rows {
					if r.Strategy == name && r.Segments == n && groupOf(r) == g && r.OrdersPerSec > 0 {
						pts = append(pts, [2]float64{px(n), py(r.OrdersPerSec)})
					}
				}
			}
			if len(pts) > 1 {
				p(`<polyline fill="none" stroke="%s" stroke-width="2.5"%s points="%s"/>`+"\n", color, dash, points(pts))
			}
			for _, pt := range pts {
				marker(p, g, pt[0], pt[1], color)
			}
			drawn = drawn || len(pts) > 0
		}
		if drawn {
			legend(color, dash, label)
		}
	}
	// The markers: what the buyer count of each is.
	for g := range groups {
		marker(p, g, legendX+14, float64(legendY), "#555555")
		p(`<text x="%.1f" y="%d" dominant-baseline="middle">%s</text>`+"\n", legendX+36, legendY, html.EscapeString(groupLabel(g)))
		legendY += 22
	}
	p("</svg>\n")
	return bw.Flush()
}

// buyerGroups sorts the rows' buyer counts into groups, by the count
// itself or by the count per segment, whichever makes fewer groups (the
// count itself on a tie, as it is plainer). It returns each row's group
// (0 to groups-1, in increasing order of count) and the groups' labels.
func buyerGroups(rows []Row) (groupOf func(Row) int, groups int, label func(int) string) {
	perSegment := func(r Row) float64 { return float64(r.Buyers) / float64(max(r.Segments, 1)) }
	absolute := func(r Row) float64 { return float64(r.Buyers) }
	distinct := func(f func(Row) float64) []float64 {
		var vs []float64
		for _, r := range rows {
			if v := f(r); !slices.Contains(vs, v) {
				vs = append(vs, v)
			}
		}
		slices.Sort(vs)
		return vs
	}
	key, unit := absolute, " buyers"
	vs := distinct(absolute)
	if ps := distinct(perSegment); len(ps) < len(vs) {
		key, unit, vs = perSegment, " buyers per segment", ps
	}
	groupOf = func(r Row) int { return slices.Index(vs, key(r)) }
	label = func(g int) string { return strconv.FormatFloat(vs[g], 'f', -1, 64) + unit }
	return groupOf, len(vs), label
}

// marker draws the g-th marker shape (circle, square, triangle, diamond,
// then again) centred on x, y.
func marker(p func(string, ...any), g int, x, y float64, color string) {
	const r = 4.5
	switch g % 4 {
	case 0:
		p(`<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"/>`+"\n", x, y, r, color)
	case 1:
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x-r, y-r, 2*r, 2*r, color)
	case 2:
		p(`<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>`+"\n", x, y-r-1, x+r+1, y+r, x-r-1, y+r, color)
	default:
		p(`<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>`+"\n", x, y-r-1, x+r+1, y, x, y+r+1, x-r-1, y, color)
	}
}

func points(pts [][2]float64) string {
	var s []byte
	for i, pt := range pts {
		if i > 0 {
			s = append(s, ' ')
		}
		s = fmt.Appendf(s, "%.1f,%.1f", pt[0], pt[1])
	}
	return string(s)
}

// humanRate writes a power of ten as 1, 10, 100, 1k, 10k, 100k, 1M...
func humanRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
