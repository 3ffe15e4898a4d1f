package curves

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/strata-ai/strata/internal/units"
)

// The look of the series: a run's loss, learning rate and NVMe bytes are
// solid lines, its eval loss a dashed line with a dot at each evaluation.
var (
	solidWidth  = vg.Points(2)
	dashedWidth = vg.Points(1.5)
	dashes      = []vg.Length{vg.Points(5), vg.Points(3)}
	dotRadius   = vg.Points(3)
	keyColor    = color.Gray{0x40} // the legend's key to the two styles
	gridColor   = color.Gray{0xe0}
	margin      = vg.Points(6) // around the figure
	legendGap   = vg.Points(12)
	headroom    = 0.05 // above a panel's largest value, of its range
)

// panel is one plot of the figure and its share of the height.
type panel struct {
	p     *plot.Plot
	share float64
}

// newPanels builds the figure's plots, top to bottom, on one step range:
// loss, learning rate, and NVMe bytes when some run has them.
func newPanels(runs []Run, o Options) ([]panel, error) {
	loss, err := lossPlot(runs, o.LogLoss)
	if err != nil {
		return nil, err
	}
	lr := series(runs, "learning rate", func(Run) bool { return true }, func(s Step) float64 { return s.LR })
	panels := []panel{{loss, 2}, {lr, 1}}
	if AnyNVMe(runs) {
		panels = append(panels, panel{nvmePlot(runs), 1})
	}
	first, last := runs[0].Steps[0].Step, runs[0].Steps[0].Step
	for _, r := range runs {
		first = min(first, r.Steps[0].Step)
		last = max(last, r.Steps[len(r.Steps)-1].Step)
	}
	for _, pn := range panels {
		pn.p.X.Min, pn.p.X.Max = float64(first), float64(last)
		pn.p.X.Tick.Marker = unlabelled{stepTicks{}}
	}
	bottom := panels[len(panels)-1].p
	bottom.X.Tick.Marker = stepTicks{}
	bottom.X.Label.Text = "step"
	return panels, nil
}

func newPlot(ylabel string) *plot.Plot {
	p := plot.New()
	p.Y.Label.Text = ylabel
	g := plotter.NewGrid()
	g.Vertical.Color, g.Horizontal.Color = gridColor, gridColor
	p.Add(g)
	return p
}

// points are the finite values of v over r's steps.
func points(r Run, v func(Step) float64) plotter.XYs {
	var xys plotter.XYs
	for _, s := range r.Steps {
		if y := v(s); !math.IsNaN(y) && !math.IsInf(y, 0) {
			xys = append(xys, plotter.XY{X: float64(s.Step), Y: y})
		}
	}
	return xys
}

// runColor is run i's colour.
func runColor(i int) color.RGBA { return Palette[i%len(Palette)] }

// addLine adds xys as a line of style ls; a single point, which a line
// would not show, as a dot.
func addLine(p *plot.Plot, xys plotter.XYs, ls draw.LineStyle) {
	switch len(xys) {
	case 0:
	case 1:
		addDots(p, xys, ls.Color)
	default:
		p.Add(&plotter.Line{XYs: xys, LineStyle: ls})
	}
}

func addDots(p *plot.Plot, xys plotter.XYs, c color.Color) {
	p.Add(&plotter.Scatter{XYs: xys, GlyphStyle: draw.GlyphStyle{Color: c, Radius: dotRadius, Shape: draw.CircleGlyph{}}})
}

func solid(c color.Color) draw.LineStyle { return draw.LineStyle{Color: c, Width: solidWidth} }
func dashed(c color.Color) draw.LineStyle {
	return draw.LineStyle{Color: c, Width: dashedWidth, Dashes: dashes}
}

// lossPlot is the loss panel: each run's loss, and its eval loss.
func lossPlot(runs []Run, logY bool) (*plot.Plot, error) {
	p := newPlot("loss")
	if logY {
		p.Y.Label.Text = "loss (log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
	}
	for i, r := range runs {
		loss := points(r, func(s Step) float64 { return s.Loss })
		eval := points(r, func(s Step) float64 { return s.EvalLoss })
		if logY {
			for _, xy := range append(loss[:len(loss):len(loss)], eval...) {
				if xy.Y <= 0 {
					return nil, fmt.Errorf("curves: run %s step %d: loss %g on a log scale: draw it on a linear one", r.Name, int64(xy.X), xy.Y)
				}
			}
		}
		c := runColor(i)
		addLine(p, loss, solid(c))
		addLine(p, eval, dashed(c))
		addDots(p, eval, c)
	}
	if !logY {
		p.Y.Max += (p.Y.Max - p.Y.Min) * headroom
	}
	return p, nil
}

// series is a panel of v, a solid line for each run that has, from 0 (v
// is a rate or a size: its magnitude is the point) to a little above the
// largest.
func series(runs []Run, ylabel string, has func(Run) bool, v func(Step) float64) *plot.Plot {
	p := newPlot(ylabel)
	for i, r := range runs {
		if has(r) {
			addLine(p, points(r, v), solid(runColor(i)))
		}
	}
	p.Y.Min = min(p.Y.Min, 0)
	p.Y.Max += (p.Y.Max - p.Y.Min) * headroom
	return p
}

// nvmePlot is the NVMe panel: the bytes read plus the bytes written a
// step, in the binary unit of the largest, of each run that moved any.
func nvmePlot(runs []Run) *plot.Plot {
	var most float64
	for _, r := range runs {
		for _, s := range r.Steps {
			if s.NVMeBytes > most {
				most = s.NVMeBytes
			}
		}
	}
	unit, size := "B", 1.0
	for _, u := range []struct {
		name string
		size int64
	}{{"KiB", units.KiB}, {"MiB", units.MiB}, {"GiB", units.GiB}, {"TiB", units.TiB}} {
		if most >= float64(u.size) {
			unit, size = u.name, float64(u.size)
		}
	}
	return series(runs, "NVMe "+unit+"/step (r+w)", movedNVMe, func(s Step) float64 { return s.NVMeBytes / size })
}

// stepTicks label the step axis at whole steps, 1, 2 or 5 times a power
// of ten apart, at most 10 labels.
type stepTicks struct{}

func (stepTicks) Ticks(lo, hi float64) []plot.Tick {
	apart := 1.0
	for k := 0; (hi-lo)/apart > 10; k++ {
		apart = []float64{2, 5, 10}[k%3] * math.Pow(10, float64(k/3))
	}
	var ts []plot.Tick
	for v := math.Ceil(lo/apart) * apart; v <= hi; v += apart {
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ts
}

// logTicks label a log axis at 1-9 times a power of ten, or where that is
// more than 10 labels at 1, 2 and 5 times one, or at the powers alone.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for _, ms := range [][]float64{{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 2, 5}, {1}} {
		ts = ts[:0]
		for p := math.Floor(math.Log10(lo)); math.Pow(10, p) <= hi; p++ {
			for _, m := range ms {
				if v := m * math.Pow(10, p); v >= lo && v <= hi {
					ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', 3, 64)})
				}
			}
		}
		if len(ts) <= 10 {
			break
		}
	}
	return ts
}

// unlabelled is a Ticker's ticks without their labels: the step axes of
// the upper panels, which the bottom one labels.
type unlabelled struct{ plot.Ticker }

func (u unlabelled) Ticks(lo, hi float64) []plot.Tick {
	ts := u.Ticker.Ticks(lo, hi)
	for i := range ts {
		ts[i].Label = ""
	}
	return ts
}

// newLegend names each run in its colour and, with an eval loss, keys the
// two line styles.
func newLegend(runs []Run) plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.ThumbnailWidth = vg.Points(24)
	l.Padding = vg.Points(3)
	for i, name := range legendNames(runs) {
		l.Add(name, &plotter.Line{LineStyle: solid(runColor(i))})
	}
	if AnyEval(runs) {
		l.Add("loss", &plotter.Line{LineStyle: solid(keyColor)})
		l.Add("eval loss", &plotter.Line{LineStyle: dashed(keyColor)},
			&plotter.Scatter{GlyphStyle: draw.GlyphStyle{Color: keyColor, Radius: dotRadius, Shape: draw.CircleGlyph{}}})
	}
	return l
}

// legendNames are the runs' names made distinct: runs of one name in
// different directories are told apart by their directories' parents
// ("a/run", "b/run"), as many as it takes; a directory given twice, by a
// number ("run (2)").
func legendNames(runs []Run) []string {
	names := make([]string, len(runs))
	dirs := make([]string, len(runs))
	for i, r := range runs {
		names[i], dirs[i] = r.Name, absDir(r.Dir)
	}
	// clash says whether another run of run i's name is in another directory.
	clash := func(i int) bool {
		for j := range runs {
			if j != i && names[j] == names[i] && dirs[j] != dirs[i] {
				return true
			}
		}
		return false
	}
	for up := 1; ; up++ {
		var longer []int
		for i := range runs {
			if clash(i) {
				longer = append(longer, i)
			}
		}
		changed := false
		for _, i := range longer {
			if n, ok := withParents(runs[i].Name, dirs[i], up); ok {
				names[i], changed = n, true
			}
		}
		if !changed {
			break
		}
	}
	seen := map[string]int{}
	for i, n := range names {
		if seen[n]++; seen[n] > 1 {
			names[i] = fmt.Sprintf("%s (%d)", n, seen[n])
		}
	}
	return names
}

func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return filepath.Clean(dir)
}

// withParents is name after the last up elements of the parent of dir;
// false when it has fewer.
func withParents(name, dir string, up int) (string, bool) {
	parents := strings.Split(filepath.ToSlash(filepath.Dir(dir)), "/")
	if parents[0] == "" {
		parents = parents[1:]
	}
	if up > len(parents) {
		return "", false
	}
	return strings.Join(append(parents[len(parents)-up:len(parents):len(parents)], name), "/"), true
}

// layOut draws the panels top to bottom in dc, each its share of the
// height, their data areas aligned on one step axis, and the legend right
// of the loss panel.
func layOut(dc draw.Canvas, panels []panel, legend plot.Legend) {
	dc = draw.Crop(dc, margin, -margin, margin, -margin)
	area := draw.Crop(dc, 0, -(legend.Rectangle(dc).Size().X + legendGap), 0, 0)
	var shares float64
	for _, pn := range panels {
		shares += pn.share
	}
	cs := make([]draw.Canvas, len(panels))
	top := area.Max.Y
	for i, pn := range panels {
		h := (area.Max.Y - area.Min.Y) * vg.Length(pn.share/shares)
		cs[i] = draw.Canvas{Canvas: area.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: area.Min.X, Y: top - h}, Max: vg.Point{X: area.Max.X, Y: top}}}
		top -= h
	}
	// The widest tick labels set the left edge of every data area, the
	// widest right padding the right edge.
	var left, right vg.Length
	for i, pn := range panels {
		d := pn.p.DataCanvas(cs[i])
		left = max(left, d.Min.X-cs[i].Min.X)
		right = max(right, cs[i].Max.X-d.Max.X)
	}
	for i, pn := range panels {
		d := pn.p.DataCanvas(cs[i])
		cs[i] = draw.Crop(cs[i], left-(d.Min.X-cs[i].Min.X), -(right - (cs[i].Max.X - d.Max.X)), 0, 0)
		pn.p.Draw(cs[i])
	}
	data := panels[0].p.DataCanvas(cs[0])
	legend.Draw(draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: area.Max.X + legendGap, Y: data.Min.Y}, Max: vg.Point{X: dc.Max.X, Y: data.Max.Y}}})
}
