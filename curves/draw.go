package curves

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgpdf"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Palette is the runs' colours, in the order of the runs (Tableau 10
// without its grey, which the axes' text would share; a tenth run takes
// the first colour again).
var Palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0x94, 0x67, 0xbd, 0xff}, // purple
	{0x8c, 0x56, 0x4b, 0xff}, // brown
	{0xe3, 0x77, 0xc2, 0xff}, // pink
	{0xbc, 0xbd, 0x22, 0xff}, // olive
	{0x17, 0xbe, 0xcf, 0xff}, // cyan
}

// Format is a figure's file format.
type Format string

const (
	PNG Format = "png"
	SVG Format = "svg"
	PDF Format = "pdf"
)

// pixelsPerInch sizes a figure: a PNG's pixels are its points at this
// resolution, and an SVG or PDF of the same pixels is the same figure.
const pixelsPerInch = 96

func pixels(n int) vg.Length { return vg.Length(n) * vg.Inch / pixelsPerInch }

// formats are the canvases of each Format, for a figure of width × height
// pixels.
var formats = map[Format]func(width, height int) vg.CanvasWriterTo{
	PNG: func(width, height int) vg.CanvasWriterTo {
		img := image.NewRGBA(image.Rect(0, 0, width, height))
		return vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseImage(img), vgimg.UseDPI(pixelsPerInch))}
	},
	SVG: func(width, height int) vg.CanvasWriterTo { return vgsvg.New(pixels(width), pixels(height)) },
	PDF: func(width, height int) vg.CanvasWriterTo { return vgpdf.New(pixels(width), pixels(height)) },
}

// formatNames lists the formats' extensions: ".pdf, .png or .svg".
func formatNames() string {
	var names []string
	for f := range formats {
		names = append(names, "."+string(f))
	}
	slices.Sort(names)
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// FormatOf is the Format of a file named path, by its extension.
func FormatOf(path string) (Format, error) {
	ext := strings.ToLower(filepath.Ext(path))
	f := Format(strings.TrimPrefix(ext, "."))
	if _, ok := formats[f]; !ok || ext == "" {
		return "", fmt.Errorf("curves: %s: unknown figure format %q: name a %s file", path, ext, formatNames())
	}
	return f, nil
}

// The figure's default and bounding sizes, in pixels.
const (
	DefaultWidthPixels  = 1200
	DefaultHeightPixels = 900
	minPixels           = 300
	maxPixels           = 20000
)

// Options are how Draw draws. The zero value is a PNG of the default size.
type Options struct {
	Format       Format // PNG when empty
	WidthPixels  int    // DefaultWidthPixels when 0
	HeightPixels int    // DefaultHeightPixels when 0
	// LogLoss draws the loss panel on a log scale (every loss > 0).
	LogLoss bool
}

func (o Options) withDefaults() Options {
	if o.Format == "" {
		o.Format = PNG
	}
	if o.WidthPixels == 0 {
		o.WidthPixels = DefaultWidthPixels
	}
	if o.HeightPixels == 0 {
		o.HeightPixels = DefaultHeightPixels
	}
	return o
}

// Validate says what is wrong with o (its defaults filled).
func (o Options) Validate() error {
	o = o.withDefaults()
	if _, ok := formats[o.Format]; !ok {
		return fmt.Errorf("curves: unknown figure format %q: want %s", o.Format, strings.ReplaceAll(formatNames(), ".", ""))
	}
	for _, d := range []struct {
		name string
		n    int
	}{{"width", o.WidthPixels}, {"height", o.HeightPixels}} {
		if d.n < minPixels || d.n > maxPixels {
			return fmt.Errorf("curves: %s %d pixels: want %d to %d", d.name, d.n, minPixels, maxPixels)
		}
	}
	return nil
}

func (o Options) String() string {
	o = o.withDefaults()
	s := fmt.Sprintf("%s %dx%d", o.Format, o.WidthPixels, o.HeightPixels)
	if o.LogLoss {
		s += " log-loss"
	}
	return s
}

// AnyNVMe says whether some step of runs moved bytes to or from NVMe:
// whether Draw draws the NVMe panel.
func AnyNVMe(runs []Run) bool {
	return slices.ContainsFunc(runs, movedNVMe)
}

// movedNVMe says whether some step of r moved bytes to or from NVMe: a
// run whose tier store kept off NVMe has no line in the NVMe panel.
func movedNVMe(r Run) bool {
	return slices.ContainsFunc(r.Steps, func(s Step) bool { return s.NVMeBytes > 0 })
}

// AnyEval says whether some step of runs has an eval loss.
func AnyEval(runs []Run) bool {
	for _, r := range runs {
		for _, s := range r.Steps {
			if !math.IsNaN(s.EvalLoss) {
				return true
			}
		}
	}
	return false
}

// Draw writes the figure of runs to w, as o says.
func Draw(w io.Writer, runs []Run, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	o = o.withDefaults()
	if len(runs) == 0 {
		return errors.New("curves: no runs to draw")
	}
	for _, r := range runs {
		if len(r.Steps) == 0 {
			return fmt.Errorf("curves: run %s has no steps", r.Name)
		}
	}
	panels, err := newPanels(runs, o)
	if err != nil {
		return err
	}
	c := formats[o.Format](o.WidthPixels, o.HeightPixels)
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	layOut(dc, panels, newLegend(runs))
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("curves: write the %s: %w", o.Format, err)
	}
	return nil
}
