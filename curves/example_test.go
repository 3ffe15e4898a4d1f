package curves_test

import (
	"bytes"
	"fmt"
	"image/png"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/curves"
)

// Example reads a run directory's steps.jsonl, as `strata train --out`
// writes it, and draws its curves as a small PNG.
func Example() {
	dir, err := os.MkdirTemp("", "curves-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	steps := `{"step":1,"loss":5.5,"lr":0.001}
{"step":2,"loss":4.75,"lr":0.002,"eval_loss":4.9}
{"step":3,"loss":4.25,"lr":0.002}
`
	if err := os.WriteFile(filepath.Join(dir, curves.StepsName), []byte(steps), 0o644); err != nil {
		fmt.Println(err)
		return
	}

	run, err := curves.Read(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	runs := []curves.Run{run}
	fmt.Println(len(run.Steps), "steps; eval:", curves.AnyEval(runs), "nvme:", curves.AnyNVMe(runs))

	var buf bytes.Buffer
	if err := curves.Draw(&buf, runs, curves.Options{WidthPixels: 640, HeightPixels: 480}); err != nil {
		fmt.Println(err)
		return
	}
	img, err := png.Decode(&buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(img.Bounds().Dx(), "x", img.Bounds().Dy())
	// Output:
	// 3 steps; eval: true nvme: false
	// 640 x 480
}
