package cmd

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/curves"
	"github.com/strata-ai/strata/internal/durable"
)

// plotCommand is `strata plot RUN [RUN...]`: the runs' curves in one
// figure (package curves draws it).
func plotCommand() *cli.Command {
	return &cli.Command{
		Name:      "plot",
		Usage:     "draw runs' loss, eval loss, learning rate and NVMe bytes per step into a PNG (or SVG, PDF)",
		UsageText: "strata plot [--out curves.png] [--width PX] [--height PX] [--log-y] RUN [RUN...]",
		Description: "Each RUN is a run directory that strata train --out wrote (its steps.jsonl; a run still training\n" +
			"is read up to its last whole line). The figure stacks panels on one step axis: the loss (eval loss\n" +
			"dashed, a dot at each evaluation), the learning rate, and the bytes read from and written to NVMe a\n" +
			"step when some run has them. Each run has one colour, named in the legend by its directory. A step a\n" +
			"resumed run wrote twice is drawn as written last; a step fp16 skipped has no loss.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Value: "curves.png", Usage: "the figure: .png, .svg or .pdf"},
			&cli.IntFlag{Name: "width", Value: curves.DefaultWidthPixels, Usage: "width in pixels (an SVG or PDF: at 96 an inch)"},
			&cli.IntFlag{Name: "height", Value: curves.DefaultHeightPixels, Usage: "height in pixels"},
			&cli.BoolFlag{Name: "log-y", Usage: "the loss on a log scale"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return usagef("plot: want one or more RUN directories")
			}
			out := c.String("out")
			format, err := curves.FormatOf(out)
			if err != nil {
				return usagef("plot: --out: %v", err)
			}
			if c.Int("width") == 0 || c.Int("height") == 0 {
				return usagef("plot: --width %d --height %d: a figure needs both, in pixels", c.Int("width"), c.Int("height"))
			}
			o := curves.Options{Format: format, WidthPixels: c.Int("width"), HeightPixels: c.Int("height"), LogLoss: c.Bool("log-y")}
			if err := o.Validate(); err != nil {
				return usagef("plot: %v", err)
			}
			var runs []curves.Run
			for _, dir := range c.Args().Slice() {
				r, err := curves.Read(dir)
				if err != nil {
					return fmt.Errorf("plot: %w", err)
				}
				runs = append(runs, r)
			}
			if err := durable.WriteFile(out, 1<<16, func(w io.Writer) error { return curves.Draw(w, runs, o) }); err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			if !curves.AnyNVMe(runs) {
				fmt.Fprintln(c.App.ErrWriter, "note: no NVMe panel: no run read or wrote NVMe (bytes_nvme_to_host and bytes_host_to_nvme are absent or 0: the runs kept their state in device and host memory)")
			}
			steps := 0
			for _, r := range runs {
				steps += len(r.Steps)
			}
			noun := "runs"
			if len(runs) == 1 {
				noun = "run"
			}
			fmt.Fprintf(c.App.Writer, "wrote %s: %d %s, %d steps\n", out, len(runs), noun, steps)
			return nil
		},
	}
}
