package cmd

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/curves"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// plotRun writes a run directory whose steps.jsonl has n steps: the loss
// falls from 2 to 1 (plus lift), the eval loss (every 10 steps, with
// eval) is 9 minus lift, so that in the loss panel the eval loss lies at
// the top and the loss in the bottom fifth; with nvme, the tier store's
// bytes. Step 5 is written twice, as a resumed run writes it.
func plotRun(t *testing.T, dir string, n int, lr, lift float64, eval, nvme bool) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for s := 1; s <= n; s++ {
		l := map[string]any{"step": s, "loss": 1 + lift + math.Exp(-float64(s)/15), "lr": lr * min(1, float64(s)/5), "step_s": 0.1}
		if eval && s%10 == 0 {
			l["eval_loss"], l["eval_tokens"] = 9-lift, 512
		}
		if nvme {
			l["bytes_nvme_to_host"], l["bytes_host_to_nvme"] = 3<<20+s<<14, 1<<20
		}
		line, _ := json.Marshal(l)
		if s == 5 {
			fmt.Fprintf(&b, `{"step":5,"loss":7,"lr":0.5}`+"\n") // the line a resumed run writes again
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "steps.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// panelRegions are the regions of a w × h figure where each series lies,
// by the shares of the height curves.Draw gives its panels (loss 2,
// learning rate 1, NVMe 1) inside its 8-pixel margin, left of the legend
// (the right fifth): the top quarter of the loss panel (plotRun's eval
// loss), its lower half (the loss), the learning rate panel and the NVMe
// panel (empty without one).
func panelRegions(w, h int, nvme bool) (evalLoss, loss, lr, nv image.Rectangle) {
	total := 3.0
	if nvme {
		total = 4
	}
	y := func(share float64) int { return 8 + int(share/total*float64(h-16)) }
	x := w * 4 / 5
	evalLoss = image.Rect(0, 0, x, y(0.5))
	loss = image.Rect(0, y(1), x, y(2))
	lr = image.Rect(0, y(2)+1, x, y(3))
	if nvme {
		nv = image.Rect(0, y(3)+1, x, h)
	}
	return evalLoss, loss, lr, nv
}

// colorPixels counts the pixels of r in img within 32 of c in each
// channel (a line's edges blend with the white behind it; the palette's
// colours are 67 or more apart, and no grey of the axes is within 32).
func colorPixels(img image.Image, r image.Rectangle, c color.RGBA) int {
	near := func(a, b uint8) bool { return int(a)-int(b) <= 32 && int(b)-int(a) <= 32 }
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			p := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			if near(p.R, c.R) && near(p.G, c.G) && near(p.B, c.B) {
				n++
			}
		}
	}
	return n
}

func readPNG(t *testing.T, path string, w, h int) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("%s is %dx%d, want %dx%d", path, b.Dx(), b.Dy(), w, h)
	}
	return img
}

// series is one run's series expected in a panel: at least min pixels of
// the run's colour, or none when !present.
type series struct {
	name    string
	r       image.Rectangle
	present bool
	min     int
}

func checkSeries(t *testing.T, img image.Image, run string, c color.RGBA, want []series) {
	t.Helper()
	for _, s := range want {
		n := colorPixels(img, s.r, c)
		if s.present && n < s.min || !s.present && n != 0 {
			t.Errorf("run %s: %d pixels of its colour in the %s region %v, want %s", run, n, s.name, s.r,
				map[bool]string{true: fmt.Sprintf("%d or more", s.min), false: "none"}[s.present])
		}
	}
}

// TestPlotRuns: `strata plot` of one run and of three draws a PNG of the
// size asked for, with each run's loss, learning rate, eval loss where it
// has one and NVMe bytes where it has them, each in its panel in the run's
// colour, and nothing of a run where it has no series.
func TestPlotRuns(t *testing.T) {
	base := t.TempDir()
	a := plotRun(t, filepath.Join(base, "x", "run"), 60, 1e-3, 0, true, true)
	b := plotRun(t, filepath.Join(base, "y", "run"), 50, 2e-3, 0.2, true, false) // the same name: told apart
	c := plotRun(t, filepath.Join(base, "c"), 60, 5e-4, 0.4, false, false)
	out := filepath.Join(t.TempDir(), "curves.png")

	for _, tc := range []struct {
		runs []string
		size []string
		w, h int
	}{
		{[]string{a}, nil, 1200, 900},
		{[]string{a, b, c}, nil, 1200, 900},
		{[]string{a, b, c}, []string{"--width", "700", "--height", "1000"}, 700, 1000},
	} {
		stdout, stderr, err := runApp(t, append(append([]string{"plot", "--out", out}, tc.size...), tc.runs...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if want := fmt.Sprintf("wrote %s: %d run", out, len(tc.runs)); !strings.HasPrefix(stdout, want) || stderr != "" {
			t.Errorf("stdout %q, want %q...; stderr %q, want nothing", stdout, want, stderr)
		}
		img := readPNG(t, out, tc.w, tc.h)
		evalLoss, loss, lr, nv := panelRegions(tc.w, tc.h, true)
		for i := range tc.runs {
			checkSeries(t, img, tc.runs[i], curves.Palette[i], []series{
				{"loss", loss, true, 500}, {"eval loss", evalLoss, i < 2, 150}, {"learning rate", lr, true, 500}, {"NVMe", nv, i == 0, 500}})
		}
	}
}

// TestPlotWithoutNVMe: runs without NVMe bytes get no NVMe panel (the
// learning rate takes the bottom third), and stderr says why.
func TestPlotWithoutNVMe(t *testing.T) {
	base := t.TempDir()
	b := plotRun(t, filepath.Join(base, "b"), 40, 2e-3, 0, true, false)
	out := filepath.Join(base, "c.png")
	_, stderr, err := runApp(t, "plot", b, "--out", out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "note: no NVMe panel: no run read or wrote NVMe") {
		t.Errorf("stderr %q, want the NVMe panel's note", stderr)
	}
	img := readPNG(t, out, 1200, 900)
	evalLoss, loss, lr, _ := panelRegions(1200, 900, false)
	checkSeries(t, img, "b", curves.Palette[0], []series{{"loss", loss, true, 500}, {"eval loss", evalLoss, true, 150}, {"learning rate", lr, true, 500}})
}

// TestPlotErrors: no RUN, a directory without steps.jsonl, an empty one
// and an unknown extension are one line each, naming what to do, and
// write nothing.
func TestPlotErrors(t *testing.T) {
	base := t.TempDir()
	good := plotRun(t, filepath.Join(base, "good"), 10, 1e-3, 0, false, false)
	empty := filepath.Join(base, "empty")
	os.Mkdir(empty, 0o755)
	os.WriteFile(filepath.Join(empty, "steps.jsonl"), nil, 0o644)
	out := filepath.Join(base, "curves.png")
	for _, tc := range []struct {
		args   []string
		status int
		want   string
	}{
		{[]string{"plot"}, 2, "strata plot: want one or more RUN directories"},
		{[]string{"plot", base}, 1, "strata plot: " + base + " has no steps.jsonl: pass a run directory that strata train --out wrote"},
		{[]string{"plot", good, filepath.Join(base, "nope")}, 1, "no such file or directory: pass a run directory that strata train --out wrote"},
		{[]string{"plot", good, empty}, 1, "strata plot: " + filepath.Join(empty, "steps.jsonl") + " has no steps: the run wrote none yet"},
		{[]string{"plot", good, "--out", filepath.Join(base, "c.jpg")}, 2, `strata plot: --out: ` + filepath.Join(base, "c.jpg") + `: unknown figure format ".jpg": name a .pdf, .png or .svg file`},
		{[]string{"plot", good, "--width", "10"}, 2, "strata plot: width 10 pixels: want 300 to 20000"},
		{[]string{"plot", good, "--height", "0"}, 2, "strata plot: --width 1200 --height 0: a figure needs both, in pixels"},
	} {
		args := append(tc.args, "--out", out)
		if strings.Contains(strings.Join(tc.args, " "), "--out") {
			args = tc.args
		}
		path, err := execute(append([]string{"strata"}, args...), &strings.Builder{}, &strings.Builder{})
		var line strings.Builder
		status := printError(path, err, &line)
		if status != tc.status || !strings.Contains(line.String(), tc.want) || strings.Count(line.String(), "\n") != 1 {
			t.Errorf("%q: status %d, %q; want %d, %q", tc.args, status, line.String(), tc.status, tc.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%s was written by a command that failed", out)
	}
}

// TestPlotTrainedRuns plots what `strata train --out` writes: a tiny
// run with --eval-data (loss, eval loss and learning rate in its colour;
// the NVMe panel left out, said), then with a run that offloads to NVMe
// beside it (its bytes in the NVMe panel).
func TestPlotTrainedRuns(t *testing.T) {
	held := writeFile(t, "held.txt", strings.Repeat("held out text. ", 40)[:8*32+1])
	cfg := writeFile(t, "data.json", dataConfig)
	run := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--data", "../testdata/train/corpus.txt", "--eval-data", held, "--eval-every", "2",
		"--steps", "8", "--out", run, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	out := filepath.Join(t.TempDir(), "curves.png")
	_, stderr, err := runApp(t, "plot", run, "--out", out, "--width", "600", "--height", "450")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "no NVMe panel") {
		t.Errorf("stderr %q, want the NVMe panel's note", stderr)
	}
	r, err := curves.Read(run)
	if err != nil || len(r.Steps) != 8 || !curves.AnyEval([]curves.Run{r}) {
		t.Fatalf("curves.Read: %d steps, eval %v, %v; want 8 and eval losses", len(r.Steps), curves.AnyEval([]curves.Run{r}), err)
	}
	img := readPNG(t, out, 600, 450)
	_, _, lr, _ := panelRegions(600, 450, false)
	lossPanel := image.Rect(0, 0, 480, lr.Min.Y)
	checkSeries(t, img, "trained", curves.Palette[0], []series{{"loss and eval loss", lossPanel, true, 300}, {"learning rate", lr, true, 300}})

	t.Run("nvme", func(t *testing.T) {
		nv := nvmetest.Dir(t)
		nvCfg := writeFile(t, "nvme.json", strings.Replace(strings.Replace(dataConfig, `"tiny"`, `"small"`, 1),
			`"offload_optimizer": {"device": "cpu"}`, `"offload_param": {"device": "nvme", "nvme_path": "`+nv+`"}, "offload_optimizer": {"device": "nvme", "nvme_path": "`+nv+`"}`, 1))
		nvCfg = writeFile(t, "nvme-budget.json", strings.Replace(mustRead(t, nvCfg), `"seed": 5`, `"seed": 5, "host_budget": "14MiB"`, 1))
		nvRun := t.TempDir()
		if _, stderr, err := runApp(t, "train", "--config", nvCfg, "--data", "../testdata/train/corpus.txt", "--steps", "4", "--out", nvRun, "--no-progress"); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		_, stderr, err := runApp(t, "plot", run, nvRun, "--out", out)
		if err != nil || strings.Contains(stderr, "no NVMe panel") {
			t.Fatalf("%v; stderr %q", err, stderr)
		}
		img := readPNG(t, out, 1200, 900)
		_, _, lr, nvPanel := panelRegions(1200, 900, true)
		checkSeries(t, img, "nvme", curves.Palette[1], []series{{"learning rate", lr, true, 300}, {"NVMe", nvPanel, true, 300}})
		checkSeries(t, img, "resident", curves.Palette[0], []series{{"NVMe", nvPanel, false, 0}})
	})
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
