package curves

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeSteps(t *testing.T, dir, content string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, StepsName), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRead reads a resumed run's steps.jsonl: the last line of each step,
// in step order; null loss, absent eval loss and NVMe bytes are NaN; a
// line cut short at the end is left out.
func TestRead(t *testing.T) {
	dir := writeSteps(t, filepath.Join(t.TempDir(), "run7"), strings.Join([]string{
		`{"step":1,"loss":5.5,"lr":0.001,"bytes_nvme_to_host":100,"bytes_host_to_nvme":20}`,
		`{"step":2,"loss":null,"lr":0.002,"grad_norm":null,"skipped":true,"bytes_nvme_to_host":0,"bytes_host_to_nvme":0}`,
		`{"step":3,"loss":4.0,"lr":0.003,"eval_loss":4.5,"eval_tokens":64}`, // after the last checkpoint: written again
		`{"step":3,"loss":3.9,"lr":0.003}`,
		`{"step":4,"loss":3.5,"lr":0.004,"eval_loss":3.75}`,
		`{"step":5,"loss":3.`, // being written
	}, "\n"))
	r, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "run7" || r.Dir != dir {
		t.Errorf("name %q dir %q, want run7 and %s", r.Name, r.Dir, dir)
	}
	nan := math.NaN()
	want := []Step{
		{1, 5.5, 0.001, nan, 120},
		{2, nan, 0.002, nan, 0},
		{3, 3.9, 0.003, nan, nan},
		{4, 3.5, 0.004, 3.75, nan},
	}
	same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
	if len(r.Steps) != len(want) {
		t.Fatalf("steps %+v, want %+v", r.Steps, want)
	}
	for i, s := range r.Steps {
		w := want[i]
		if s.Step != w.Step || !same(s.Loss, w.Loss) || !same(s.LR, w.LR) || !same(s.EvalLoss, w.EvalLoss) || !same(s.NVMeBytes, w.NVMeBytes) {
			t.Errorf("step %d: %+v, want %+v", i, s, w)
		}
	}
	// The file itself names the run by its directory.
	r2, err := Read(filepath.Join(dir, StepsName))
	if err != nil || r2.Name != "run7" || len(r2.Steps) != 4 {
		t.Errorf("Read(steps.jsonl) = %s, %d steps, %v; want run7, 4 steps", r2.Name, len(r2.Steps), err)
	}
}

func TestReadErrors(t *testing.T) {
	base := t.TempDir()
	noSteps := filepath.Join(base, "nosteps")
	os.Mkdir(noSteps, 0o755)
	for _, tc := range []struct {
		dir  string
		want string
	}{
		{noSteps, noSteps + " has no steps.jsonl: pass a run directory that strata train --out wrote"},
		{filepath.Join(base, "missing"), "no such file or directory: pass a run directory"},
		{writeSteps(t, filepath.Join(base, "empty"), ""), "has no steps: the run wrote none yet"},
		{writeSteps(t, filepath.Join(base, "blank"), "\n\n"), "has no steps"},
		{writeSteps(t, filepath.Join(base, "bad"), `{"step":1,"loss":2,"lr":1}`+"\n"+`{"step":2,"loss":`+"\n"+`{"step":3}`+"\n"), "steps.jsonl: line 2: unexpected end of JSON input"},
		{writeSteps(t, filepath.Join(base, "nostep"), `{"loss":2,"lr":1}`+"\n"), `line 1: no "step"`},
		{writeSteps(t, filepath.Join(base, "long"), strings.Repeat(" ", maxLineBytes+1)+"\n"), "line 1 is longer than 1048576 bytes"},
	} {
		_, err := Read(tc.dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "curves: ") {
			t.Errorf("Read(%s): %v, want curves: ...%s", filepath.Base(tc.dir), err, tc.want)
		}
	}
}

// handRun is a run of n steps whose loss falls from 2 to 1 (plus lift) and
// whose eval loss, every 10 steps when eval, is 9 minus lift: in the loss
// panel, the eval loss lies at the top and the loss in the bottom fifth.
func handRun(name string, n int, lr, lift float64, eval, nvme bool) Run {
	r := Run{Name: name, Dir: name}
	for s := 1; s <= n; s++ {
		st := Step{Step: int64(s), Loss: 1 + lift + math.Exp(-float64(s)/15), LR: lr * min(1, float64(s)/5), EvalLoss: math.NaN(), NVMeBytes: math.NaN()}
		if eval && s%10 == 0 {
			st.EvalLoss = 9 - lift
		}
		if nvme {
			st.NVMeBytes = float64(3<<20 + s<<14)
		}
		r.Steps = append(r.Steps, st)
	}
	return r
}

// region is a rectangle of the figure, in pixels.
type region = image.Rectangle

// marginPixels is Draw's margin around the figure (6 pt at 96 pixels an
// inch).
const marginPixels = 8

// bands are the panels' regions in a figure of w × h pixels, by the shares
// Draw gives them (loss 2, learning rate 1, NVMe 1; without NVMe loss 2,
// learning rate 1), left of the legend (the right fifth). lossTop is the
// top quarter of the loss panel, where handRun's eval loss lies, and
// lossBottom the lower half, where its loss does.
func bands(w, h int, nvme bool) (lossTop, lossBottom, lr, nv region) {
	shares := []float64{2, 1}
	if nvme {
		shares = append(shares, 1)
	}
	y := func(frac float64) int { return marginPixels + int(frac*float64(h-2*marginPixels)) }
	total := 0.0
	for _, s := range shares {
		total += s
	}
	x1 := w * 4 / 5
	lossEnd := 2 / total
	lossTop = image.Rect(0, 0, x1, y(lossEnd/4))
	lossBottom = image.Rect(0, y(lossEnd/2), x1, y(lossEnd))
	lr = image.Rect(0, y(lossEnd)+1, x1, y(lossEnd+1/total))
	if nvme {
		nv = image.Rect(0, y(lossEnd+1/total)+1, x1, h)
	}
	return lossTop, lossBottom, lr, nv
}

// near is how far a pixel's channels may be from a run's colour for the
// pixel to count as the run's: a line's edges are blended with the white
// behind it. Palette's colours are 67 or more apart in some channel,
// and a grey (the text, the grid) is never within 32 of one.
const near = 32

// count is the pixels of c (or near it) in r of img.
func count(img image.Image, r region, c color.RGBA) int {
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			p := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			if diff(p.R, c.R) <= near && diff(p.G, c.G) <= near && diff(p.B, c.B) <= near {
				n++
			}
		}
	}
	return n
}

func diff(a, b uint8) int { return max(int(a)-int(b), int(b)-int(a)) }

// The fewest pixels of a run's colour that show its line across a panel
// (a line 2 pt wide over 600 pixels has over a thousand), and its eval
// loss (five dots, 300 pixels, and the dashes between them).
const (
	minLinePixels = 500
	minEvalPixels = 200
)

func drawPNG(t *testing.T, runs []Run, o Options) image.Image {
	t.Helper()
	var buf bytes.Buffer
	if err := Draw(&buf, runs, o); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != o.withDefaults().WidthPixels || b.Dy() != o.withDefaults().HeightPixels {
		t.Fatalf("figure %dx%d, want %v", b.Dx(), b.Dy(), o)
	}
	return img
}

// TestDrawSeries finds every series of three runs in its panel by the
// run's colour: the loss and learning rate of each, the eval loss of the
// two with one, the NVMe bytes of the one that moved any (not of the one
// whose tier store moved none), and none where a run has none.
func TestDrawSeries(t *testing.T) {
	runs := []Run{
		handRun("a", 60, 1e-3, 0, true, true),
		handRun("b", 50, 2e-3, 0.2, true, false),
		handRun("c", 60, 5e-4, 0.4, false, false),
	}
	for i := range runs[1].Steps {
		runs[1].Steps[i].NVMeBytes = 0 // a tier store that kept off NVMe
	}
	for _, o := range []Options{{}, {WidthPixels: 800, HeightPixels: 1000}, {LogLoss: true}} {
		img := drawPNG(t, runs, o)
		lossTop, lossBottom, lr, nv := bands(img.Bounds().Dx(), img.Bounds().Dy(), true)
		for i, r := range runs {
			c := Palette[i]
			hasEval, hasNVMe := i < 2, i == 0
			for _, p := range []struct {
				name string
				r    region
				want bool
				min  int
			}{{"loss", lossBottom, true, minLinePixels}, {"eval loss", lossTop, hasEval, minEvalPixels},
				{"learning rate", lr, true, minLinePixels}, {"NVMe", nv, hasNVMe, minLinePixels}} {
				n := count(img, p.r, c)
				if p.want && n < p.min || !p.want && n != 0 {
					t.Errorf("%v: run %s: %d pixels of its colour in the %s panel, want %s", o, r.Name, n, p.name, map[bool]string{true: "a line", false: "none"}[p.want])
				}
			}
		}
	}
}

// TestDrawWithoutNVMe leaves the NVMe panel out: the learning rate takes
// the bottom third.
func TestDrawWithoutNVMe(t *testing.T) {
	runs := []Run{handRun("a", 30, 1e-3, 0, true, false), handRun("b", 30, 2e-3, 0.1, false, false)}
	for i := range runs {
		runs[i].Steps[0].NVMeBytes = 0 // a tier store without NVMe
	}
	if AnyNVMe(runs) {
		t.Fatal("AnyNVMe of runs without NVMe bytes")
	}
	img := drawPNG(t, runs, Options{})
	lossTop, lossBottom, lr, _ := bands(img.Bounds().Dx(), img.Bounds().Dy(), false)
	for i := range runs {
		if n := count(img, lossBottom, Palette[i]); n < minLinePixels {
			t.Errorf("run %d: %d pixels of loss", i, n)
		}
		if n := count(img, lr, Palette[i]); n < minLinePixels {
			t.Errorf("run %d: %d pixels of learning rate in the bottom third", i, n)
		}
	}
	if n := count(img, lossTop, Palette[0]); n < minEvalPixels {
		t.Errorf("%d pixels of eval loss", n)
	}
}

// TestDrawOneStep draws a run of one step: its loss and learning rate are
// dots.
func TestDrawOneStep(t *testing.T) {
	img := drawPNG(t, []Run{handRun("a", 1, 1e-3, 0, false, false)}, Options{})
	if n := count(img, img.Bounds(), Palette[0]); n < 2*20 {
		t.Errorf("%d pixels of the run's colour, want two dots", n)
	}
}

func TestDrawErrors(t *testing.T) {
	good := []Run{handRun("a", 10, 1e-3, 0, false, false)}
	zero := []Run{handRun("z", 10, 1e-3, 0, false, false)}
	zero[0].Steps[3].Loss = 0
	for _, tc := range []struct {
		runs []Run
		o    Options
		want string
	}{
		{nil, Options{}, "curves: no runs to draw"},
		{[]Run{{Name: "e"}}, Options{}, "curves: run e has no steps"},
		{good, Options{Format: "gif"}, `curves: unknown figure format "gif": want pdf, png or svg`},
		{good, Options{WidthPixels: 100}, "curves: width 100 pixels: want 300 to 20000"},
		{good, Options{HeightPixels: 1 << 20}, "curves: height 1048576 pixels: want 300 to 20000"},
		{zero, Options{LogLoss: true}, "curves: run z step 4: loss 0 on a log scale: draw it on a linear one"},
	} {
		err := Draw(&bytes.Buffer{}, tc.runs, tc.o)
		if err == nil || err.Error() != tc.want {
			t.Errorf("Draw(%v): %v, want %s", tc.o, err, tc.want)
		}
	}
}

func TestFormats(t *testing.T) {
	runs := []Run{handRun("a", 20, 1e-3, 0, true, true)}
	for _, tc := range []struct {
		path, prefix string
	}{{"x/curves.png", "\x89PNG"}, {"curves.SVG", "<?xml"}, {"c.pdf", "%PDF"}} {
		f, err := FormatOf(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := Draw(&buf, runs, Options{Format: f}); err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(buf.Bytes(), []byte(tc.prefix)) {
			t.Errorf("%s: starts %q, want %q", tc.path, buf.Bytes()[:min(8, buf.Len())], tc.prefix)
		}
	}
	for _, p := range []string{"curves.jpg", "curves", "png"} {
		if _, err := FormatOf(p); err == nil || !strings.Contains(err.Error(), "name a .pdf, .png or .svg file") {
			t.Errorf("FormatOf(%s): %v", p, err)
		}
	}
}

func TestLegendNames(t *testing.T) {
	run := func(dir string) Run { return Run{Name: filepath.Base(dir), Dir: dir} }
	for _, tc := range []struct {
		dirs []string
		want string
	}{
		{[]string{"/x/a", "/x/b"}, "a b"},
		{[]string{"/x/a/run", "/x/b/run", "/x/c"}, "a/run b/run c"},
		{[]string{"/x/a/run", "/y/a/run"}, "x/a/run y/a/run"},
		{[]string{"/r/run", "/r/run"}, "run run (2)"}, {[]string{"/r/run", "/s/run", "/r/run"}, "r/run s/run r/run (2)"},
	} {
		var runs []Run
		for _, d := range tc.dirs {
			runs = append(runs, run(d))
		}
		if got := strings.Join(legendNames(runs), " "); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.dirs, got, tc.want)
		}
	}
}

func TestStepTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{
		{1, 8, "1 2 3 4 5 6 7 8"},
		{1, 100, "10 20 30 40 50 60 70 80 90 100"},
		{1, 60, "10 20 30 40 50 60"},
		{5, 30, "5 10 15 20 25 30"},
		{1, 12000, "2000 4000 6000 8000 10000 12000"},
	} {
		var got []string
		for _, tk := range (stepTicks{}).Ticks(tc.lo, tc.hi) {
			got = append(got, tk.Label)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("ticks of %v..%v: %v, want %s", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestLogTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{
		{2.3, 9.7, "3 4 5 6 7 8 9"},
		{0.5, 12, "0.5 1 2 5 10"},
		{1e-3, 1e3, "0.001 0.01 0.1 1 10 100 1e+03"},
	} {
		var got []string
		for _, tk := range (logTicks{}).Ticks(tc.lo, tc.hi) {
			got = append(got, tk.Label)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("ticks of %v..%v: %v, want %s", tc.lo, tc.hi, got, tc.want)
		}
	}
}
