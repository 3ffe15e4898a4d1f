package cmd

import (
	"strings"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/urfave/cli/v2"
)

// benchGemmCommand is `strata bench gemm`: the CPU backend's GEMM at the
// model's shapes against the machine's peak.
func benchGemmCommand() *cli.Command {
	return &cli.Command{
		Name:  "gemm",
		Usage: "GEMM GFLOP/s of the CPU backend at a model's shapes, with the machine's peak and the ratio",
		Description: "For each linear layer of the model (qkv, attn-proj, fc, fc-proj, head) it times the forward\n" +
			"GEMM (Y = X·Wᵀ), the input gradient (dX = dY·W) and the weight gradient (dW += dYᵀ·X), with\n" +
			"--rows rows of activations (B*T), in each storage dtype. The peak is cores × FMA units × fp32\n" +
			"lanes × 2 × clock (the number of FMA units per core is assumed: 2).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "shape", Value: "gpt2", Usage: "named model shape"},
			&cli.IntFlag{Name: "rows", Value: 1024, Usage: "rows of the activations (batch × sequence)"},
			&cli.StringFlag{Name: "dtype", Value: "fp32,bf16", Usage: "storage dtypes, comma-separated"},
			&cli.StringFlag{Name: "layers", Value: strings.Join(bench.GemmLayers, ","), Usage: "layers to time, comma-separated"},
			&cli.IntFlag{Name: "workers", Usage: "CPU backend workers (default GOMAXPROCS)"},
			&cli.StringFlag{Name: "kernel", Value: "auto", Usage: "CPU backend GEMM kernel: auto, avx512 or gonum"},
			&cli.Float64Flag{Name: "min-time", Value: 0.5, Usage: "seconds of repetitions per GEMM (at least one)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
		},
		Action: func(c *cli.Context) error {
			o := bench.GemmOptions{Shape: c.String("shape"), Rows: c.Int("rows"), Workers: c.Int("workers"),
				MinSeconds: c.Float64("min-time"), Kernel: c.String("kernel"), Layers: gemmSplitList(c.String("layers"))}
			for _, name := range gemmSplitList(c.String("dtype")) {
				dt, err := dtype.Parse(name)
				if err != nil {
					return usagef("--dtype: %v", err)
				}
				o.DTypes = append(o.DTypes, gpu.DType(dt))
			}
			if err := o.WithDefaults().Validate(); err != nil {
				return usagef("%v", err)
			}
			res, err := bench.RunGemm(o)
			if err != nil {
				return err
			}
			return printResult(c.App.Writer, c.Bool("json"), res)
		},
	}
}

func gemmSplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
