package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// A chart is drawn in three steps: a timeChart collects layers in data
// units, build scales them into a chart of SVG coordinates (strings ready
// for attributes), and the page template writes the chart as inline SVG.

// chart is one plot ready for the template.
type chart struct {
	Title, Note string
	W, H        string // viewBox size
	Width       string // width attribute (CSS pixels at 1:1)
	Left, Top   string // plot area origin
	Right       string // x of the plot area's right edge
	Bottom      string // y of the plot area's bottom edge
	TickEnd     string // y of the lower end of an x tick mark
	XTicks      []tick
	YTicks      []tick
	XRow2       string // label of the second row of x tick labels (API-equivalent time)
	XRow2X      string
	XRow2Y      string
	XLabelY     string
	Paths       []svgPath
	Bars        []svgRect
	Bands       []svgRect
	Rules       []svgRule
	Legend      []legendItem
	Empty       string // shown instead of the plot when there is no data
	Size        string // "full", "half" or "small": the CSS class of the figure
}

type tick struct {
	Pos    string // x (for x ticks) or y (for y ticks) coordinate
	Label  string
	Label2 string // API-equivalent time under an x tick
	LabelY string // y of the x tick label
	Y2     string // y of Label2
}

type svgPath struct {
	D      string
	Color  string
	Width  string
	Dash   string
	Fill   string // "none" for a line; a colour for an area
	Name   string
	Points int
}

type svgRect struct {
	X, Y, W, H string
	Color      string
	Title      string
}

type svgRule struct {
	X, Y1, Y2 string
	Title     string
}

type legendItem struct {
	Name  string
	Color string
	Dash  string
	Band  bool // a shaded area rather than a line
	Width string
}

// layers of a timeChart, in data units.
type lineLayer struct {
	name, color string
	width       float64
	dash        string
	pts         []point
	area        bool // fill the area under the line, lightly
}

type barLayer struct {
	bins       []bin
	colorA     string
	colorB     string
	nameA      string
	nameB      string
	unitSingle string // the bar width, for tooltips ("5 s")
}

type bandLayer struct {
	name, color string
	spans       []span
	strip       bool // a strip along the top instead of the full height
}

type ruleLayer struct {
	t     float64
	title string
}

// timeChart is a plot over time: seconds since the run (or arm) started on
// x, starting at 0; a quantity starting at 0 on y.
type timeChart struct {
	title, note string
	size        chartSize
	xMax        float64 // 0: the data's extent
	yMin        float64 // the y axis reaches at least this
	yFmt        func(float64) string
	speed       float64 // > 1 adds API-equivalent time under the x ticks
	lines       []lineLayer
	bars        *barLayer
	bands       []bandLayer
	rules       []ruleLayer
	empty       string
}

// chartSize is a chart's footprint on the page: full width, half width
// (two side by side) or small (three a row, one per lane).
type chartSize int

const (
	sizeFull chartSize = iota
	sizeHalf
	sizeSmall
)

func (s chartSize) String() string {
	return [...]string{"full", "half", "small"}[s]
}

// geometry is a size's viewBox, plot margins and font size in SVG units.
// The viewBox matches the CSS width of the figure, so text is drawn at
// about its nominal size.
func (s chartSize) geometry() (w, h, left, right, font float64) {
	switch s {
	case sizeHalf:
		return 540, 230, 56, 12, 12
	case sizeSmall:
		return 356, 170, 44, 10, 11
	}
	return 1100, 260, 64, 16, 12
}

func (tc *timeChart) hasData() bool {
	for _, l := range tc.lines {
		if len(l.pts) >= 2 {
			return true
		}
	}
	return tc.bars != nil && len(tc.bars.bins) > 0
}

// build lays the chart out.
func (tc *timeChart) build() chart {
	w, h, left, right, font := tc.size.geometry()
	top := 10.0
	for _, b := range tc.bands {
		if b.strip {
			top += 8 // the strip sits above the plot, clear of the data
			break
		}
	}
	bottom := font + 14
	if tc.speed > 1 {
		bottom += font + 4
	}
	pw, ph := w-left-right, h-top-bottom
	c := chart{
		Title: tc.title, Note: tc.note, Size: tc.size.String(),
		W: f1(w), H: f1(h), Width: f1(w),
		Left: f1(left), Top: f1(top), Right: f1(left + pw), Bottom: f1(top + ph),
	}
	for _, l := range tc.lines {
		c.Legend = append(c.Legend, legendItem{Name: l.name, Color: l.color, Dash: l.dash, Width: f1(max(l.width, 2))})
	}
	if tc.bars != nil {
		c.Legend = append(c.Legend,
			legendItem{Name: tc.bars.nameA, Color: tc.bars.colorA, Band: true},
			legendItem{Name: tc.bars.nameB, Color: tc.bars.colorB, Band: true})
	}
	for _, b := range tc.bands {
		c.Legend = append(c.Legend, legendItem{Name: b.name, Color: b.color, Band: true})
	}
	if !tc.hasData() {
		c.Empty = tc.empty
		if c.Empty == "" {
			c.Empty = "no data"
		}
		return c
	}

	// Extents.
	xMax := tc.xMax
	yMax := tc.yMin
	for _, l := range tc.lines {
		for _, p := range l.pts {
			if tc.xMax == 0 {
				xMax = max(xMax, p.X)
			}
			yMax = max(yMax, p.Y)
		}
	}
	if tc.bars != nil {
		for _, b := range tc.bars.bins {
			if tc.xMax == 0 {
				xMax = max(xMax, b.To)
			}
			yMax = max(yMax, b.A+b.B)
		}
	}
	if !(xMax > 0) {
		xMax = 1
	}
	yTicks, yTop := niceTicks(yMax, 4)
	sx := func(v float64) float64 { return left + min(max(v, 0), xMax)/xMax*pw }
	sy := func(v float64) float64 { return top + ph - min(max(v, 0), yTop)/yTop*ph }

	yFmt := tc.yFmt
	if yFmt == nil {
		yFmt = fmtCount
	}
	for _, v := range yTicks {
		c.YTicks = append(c.YTicks, tick{Pos: f1(sy(v)), Label: yFmt(v)})
	}
	maxTicks := 8
	switch tc.size {
	case sizeHalf:
		maxTicks = 6
	case sizeSmall:
		maxTicks = 4
	}
	step := timeStep(xMax, maxTicks)
	c.XLabelY = f1(top + ph + font + 4)
	c.TickEnd = f1(top + ph + 4)
	if tc.speed > 1 {
		c.XRow2, c.XRow2X = "API-eq.", f1(left-16)
		if tc.size == sizeSmall {
			c.XRow2, c.XRow2X = "≈", f1(left-12)
		}
		c.XRow2Y = f1(top + ph + 2*font + 8)
	}
	for v := 0.0; v <= xMax+1e-9; v += step {
		t := tick{Pos: f1(sx(v)), Label: fmtClock(v, step), LabelY: c.XLabelY}
		if tc.speed > 1 {
			t.Label2 = fmtClock(v*tc.speed, step*tc.speed)
			t.Y2 = c.XRow2Y
		}
		c.XTicks = append(c.XTicks, t)
	}

	// Layers, back to front: bands, bars, rules, lines.
	gap := xMax / float64(pw) // one unit of width
	for _, b := range tc.bands {
		y, hh := top, ph
		if b.strip {
			y, hh = top-8, 5
		}
		for _, s := range coarsen(b.spans, gap) {
			x0, x1 := sx(s.From), sx(s.To)
			c.Bands = append(c.Bands, svgRect{
				X: f1(x0), Y: f1(y), W: f1(max(x1-x0, 1)), H: f1(hh), Color: b.color,
				Title: fmt.Sprintf("%s: %s–%s", b.name, fmtClock(s.From, 1), fmtClock(s.To, 1)),
			})
		}
	}
	if tc.bars != nil {
		for _, b := range tc.bars.bins {
			if b.A+b.B <= 0 {
				continue
			}
			x0, x1 := sx(b.From), sx(b.To)
			bw := max(x1-x0-1, 1)
			ya, yb := sy(b.A), sy(b.A+b.B)
			when := fmtClock(b.From, 1) + "–" + fmtClock(b.To, 1)
			if b.A > 0 {
				c.Bars = append(c.Bars, svgRect{X: f1(x0), Y: f1(ya), W: f1(bw), H: f1(top + ph - ya), Color: tc.bars.colorA,
					Title: fmt.Sprintf("%s %s: %s", when, tc.bars.nameA, fmtCount(b.A))})
			}
			if b.B > 0 {
				c.Bars = append(c.Bars, svgRect{X: f1(x0), Y: f1(yb), W: f1(bw), H: f1(ya - yb), Color: tc.bars.colorB,
					Title: fmt.Sprintf("%s %s: %s", when, tc.bars.nameB, fmtCount(b.B))})
			}
		}
	}
	for _, r := range tc.rules {
		c.Rules = append(c.Rules, svgRule{X: f1(sx(r.t)), Y1: f1(top), Y2: f1(top + ph), Title: r.title})
	}
	for _, l := range tc.lines {
		if len(l.pts) == 0 {
			continue
		}
		pts := downsample(l.pts, MaxPoints)
		p := svgPath{D: pathD(pts, sx, sy), Color: l.color, Width: f1(l.width), Dash: l.dash, Fill: "none", Name: l.name, Points: len(pts)}
		if l.area && len(pts) >= 2 {
			a := svgPath{D: areaD(pts, sx, sy, sy(0)), Fill: l.color, Color: "none", Width: "0", Name: l.name, Points: len(pts)}
			c.Paths = append(c.Paths, a)
		}
		c.Paths = append(c.Paths, p)
	}
	return c
}

// pathD is the SVG path data of a polyline through pts, scaled by sx and
// sy: "M x,y L x,y ...", one decimal. Points whose y is NaN break the line.
func pathD(pts []point, sx, sy func(float64) float64) string {
	var b strings.Builder
	b.Grow(len(pts) * 14)
	pen := false
	for _, p := range pts {
		if math.IsNaN(p.Y) || math.IsNaN(p.X) {
			pen = false
			continue
		}
		if pen {
			b.WriteByte('L')
		} else {
			b.WriteByte('M')
			pen = true
		}
		b.WriteString(f1(sx(p.X)))
		b.WriteByte(',')
		b.WriteString(f1(sy(p.Y)))
	}
	return b.String()
}

// areaD is the path of the area between the line through pts and y0.
func areaD(pts []point, sx, sy func(float64) float64, y0 float64) string {
	d := pathD(pts, sx, sy)
	return d + "L" + f1(sx(pts[len(pts)-1].X)) + "," + f1(y0) + "L" + f1(sx(pts[0].X)) + "," + f1(y0) + "Z"
}

// niceTicks returns tick values 0, step, 2·step, … covering vmax with
// about n steps of 1, 2, 2.5 or 5 times a power of ten, and the top value.
func niceTicks(vmax float64, n int) ([]float64, float64) {
	if !(vmax > 0) || math.IsInf(vmax, 0) {
		vmax = 1
	}
	raw := vmax / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag * 10
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	top := math.Ceil(vmax/step-1e-9) * step
	var ticks []float64
	for i := 0; float64(i)*step <= top+step/1e6; i++ {
		ticks = append(ticks, float64(i)*step)
	}
	return ticks, top
}

// timeStep is a nice tick step giving at most about n ticks over xmax
// seconds.
func timeStep(xmax float64, n int) float64 {
	return niceDuration(xmax / float64(n))
}

// fmtClock formats seconds as "45s", "2m", "2m30s", "1h05m", to the
// precision the tick step needs.
func fmtClock(s, step float64) string {
	if s < 0 {
		s = 0
	}
	switch {
	case s < 60 && (step < 60 || s == 0):
		if s == math.Trunc(s) || s >= 10 {
			return strconv.Itoa(int(math.Round(s))) + "s"
		}
		return strconv.FormatFloat(s, 'f', 1, 64) + "s"
	case s < 3600:
		m, sec := int(s)/60, int(math.Round(s))%60
		if sec == 0 || step >= 60 {
			return strconv.Itoa(int(math.Round(s/60))) + "m"
		}
		return fmt.Sprintf("%dm%02ds", m, sec)
	default:
		m := int(math.Round(s / 60))
		return fmt.Sprintf("%dh%02dm", m/60, m%60)
	}
}

// fmtDuration formats a wall-clock duration for the table: "0.8 s",
// "52.3 s", "8m 12s", "2h 03m".
func fmtDuration(s float64) string {
	switch {
	case s < 60:
		return strconv.FormatFloat(s, 'f', 1, 64) + " s"
	case s < 3600:
		r := int(math.Round(s))
		return fmt.Sprintf("%dm %02ds", r/60, r%60)
	default:
		r := int(math.Round(s / 60))
		return fmt.Sprintf("%dh %02dm", r/60, r%60)
	}
}

// fmtCount formats an axis value: "0", "12", "2.5", "1.2k", "3M".
func fmtCount(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return trimZero(strconv.FormatFloat(v/1e6, 'f', 2, 64)) + "M"
	case a >= 1e4:
		return trimZero(strconv.FormatFloat(v/1e3, 'f', 1, 64)) + "k"
	case a >= 1 || a == 0:
		return trimZero(strconv.FormatFloat(v, 'f', 1, 64))
	default:
		return trimZero(strconv.FormatFloat(v, 'f', 3, 64))
	}
}

// fmtUSDAxis formats dollars for an axis.
func fmtUSDAxis(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "$0"
	case a >= 100:
		return "$" + strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 1:
		return "$" + trimZero(strconv.FormatFloat(v, 'f', 2, 64))
	default:
		return "$" + trimZero(strconv.FormatFloat(v, 'f', 4, 64))
	}
}

func trimZero(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(s, "0")
		s = strings.TrimSuffix(s, ".")
	}
	return s
}

// f1 formats a coordinate with one decimal.
func f1(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "0"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
