package cmd

import (
	"fmt"
	"strconv"
	"time"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/cpuadam"
	"github.com/urfave/cli/v2"
)

// adamDefaults are the library's defaults, shown in --help and applied to
// the flags that were not given.
var adamDefaults = bench.AdamOptions{}.WithDefaults()

// benchAdamCommand is `strata bench adam`: the CPU AdamW kernel against the
// machine's memory bandwidth.
func benchAdamCommand() *cli.Command {
	return &cli.Command{
		Name:  "adam",
		Usage: "time the CPU AdamW step (params/s, GB/s) against the r4w3 memory roofline",
		Description: "One AdamW step over --params parameters reads param, grad, m, v and writes param, m, v:\n" +
			"fp32 param r/w 8 B + grad 4 (bf16, fp16: 2) + m, v r/w in --moments precision (fp32 16, bf16 8,\n" +
			"int8 4 + 0.0625 for the per-256 fp32 scales) + 2 with --bf16-out; 28, 20 or 16.0625 B/param\n" +
			"with fp32 gradients. Narrow moments also time the fp32 step, alternately, and print the speed-up.\n" +
			"--master bf16+remainder keeps the master as the bf16 params (needs --bf16-out) plus a 16-bit remainder\n" +
			"and a bit (reads the params, reads and writes 2.125 B instead of the fp32 master's 4) and is timed\n" +
			"against the fp32 step the same way.\n" +
			"With --roofline each timed step alternates with one r4w3 pass (read 4 fp32 streams, write 3:\n" +
			"the membw roofline's pattern) over the same arrays and threads, and the ratio of the medians\n" +
			"(GB/s of the step's own bytes over r4w3 GB/s) is printed.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "params", Usage: "parameters per step", DefaultText: strconv.Itoa(adamDefaults.Params)},
			&cli.IntFlag{Name: "threads", Usage: "kernel threads", DefaultText: strconv.Itoa(adamDefaults.Threads)},
			&cli.StringFlag{Name: "grad", Value: "fp32", Usage: "gradient dtype: fp32, bf16 or fp16 (fp16 mixed precision: --bf16-out then writes fp16 params)"},
			&cli.BoolFlag{Name: "bf16-out", Usage: "also write the new params as bf16 (fused; fp16 with --grad fp16)"},
			&cli.StringFlag{Name: "moments", Value: "fp32", Usage: "stored precision of m and v: fp32, bf16 or int8"},
			&cli.StringFlag{Name: "master", Value: "fp32", Usage: "master weights: fp32 or bf16+remainder (with --bf16-out)"},
			&cli.StringFlag{Name: "isa", Value: "auto", Usage: "kernels: auto, avx512, avx2 or go"},
			&cli.BoolFlag{Name: "roofline", Value: true, Usage: "measure the r4w3 memory bandwidth in the same run"},
			&cli.IntFlag{Name: "rounds", Usage: "timed steps (medians are reported)", DefaultText: strconv.Itoa(adamDefaults.Rounds)},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
		},
		Action: func(c *cli.Context) error {
			isa, err := cpuadam.ParseISA(c.String("isa"))
			if err != nil {
				return usagef("%v", err)
			}
			// Defaults only for the flags not given: an explicit 0 is
			// refused by Validate, not replaced.
			o := bench.AdamOptions{BF16Out: c.Bool("bf16-out"), ISA: isa, Roofline: c.Bool("roofline")}.WithDefaults()
			if c.IsSet("params") {
				o.Params = c.Int("params")
			}
			if c.IsSet("threads") {
				o.Threads = c.Int("threads")
			}
			if c.IsSet("rounds") {
				o.Rounds = c.Int("rounds")
			}
			switch c.String("grad") {
			case "fp32":
			case "bf16":
				o.GradBF16 = true
			case "fp16":
				o.GradF16 = true
			default:
				return usagef("--grad %q: want fp32, bf16 or fp16", c.String("grad"))
			}
			if o.Moments, err = cpuadam.ParseMoments(c.String("moments")); err != nil {
				return usagef("--moments: %v", err)
			}
			switch c.String("master") {
			case "fp32":
			case "bf16+remainder":
				o.Remainder = true
			default:
				return usagef("--master %q: want fp32 or bf16+remainder", c.String("master"))
			}
			if err := o.Validate(); err != nil {
				return usagef("%v", err)
			}
			stderr := c.App.ErrWriter
			o.Progress = func(round, rounds int, elapsed time.Duration) {
				if elapsed > 3*time.Second {
					fmt.Fprintf(stderr, "bench adam: round %d/%d, %.1fs\n", round, rounds, elapsed.Seconds())
				}
			}
			res, err := bench.RunAdam(o)
			if err != nil {
				return err
			}
			w := c.App.Writer
			if c.Bool("json") {
				return printResult(w, true, res)
			}
			fmt.Fprintf(w, "adam: isa=%s threads=%d params=%d grad=%s moments=%s master=%s bf16-out=%v rounds=%d\n",
				res.ISA, res.Threads, res.Params, res.Grad, res.Moments, res.Master, res.BF16Out, res.Rounds)
			fmt.Fprintf(w, "  step %.1f ms median: %.3g params/s, %.2f GB/s at %.4g B/param (best %.2f GB/s)\n",
				res.StepSeconds*1e3, res.ParamsPerS, res.GBps, res.BytesPerParam, res.GBpsBest)
			if res.SpeedupVsFP32 > 0 {
				fmt.Fprintf(w, "  fp32 moments and master, alternated: %.3g params/s, %.2f GB/s; %s moments, %s master are %.3fx its params/s\n",
					res.FP32ParamsPerS, res.FP32GBps, res.Moments, res.Master, res.SpeedupVsFP32)
			}
			if res.RooflineGBps > 0 {
				fmt.Fprintf(w, "  roofline r4w3 (%s, same arrays and threads, 28 B/elem): %.2f GB/s median (best %.2f)\n",
					res.RooflineISA, res.RooflineGBps, res.RooflineGBpsBest)
				fmt.Fprintf(w, "  ratio to roofline: %.3f\n", res.Ratio)
			}
			return nil
		},
	}
}
