package cmd

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/internal/units"
)

// exportCommand is `strata export CKPT OUT.safetensors`: the model weights of
// a training checkpoint (fp32 master weights when it holds them, else the
// params) gathered from every rank's shards into one safetensors file.
func exportCommand() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "write a training checkpoint's weights as one safetensors file",
		UsageText: "strata export [--names strata|hf] [--dtype fp32|bf16] CHECKPOINT OUT.safetensors",
		Description: "CHECKPOINT is named as --resume names it: a run's --out directory or its checkpoints/ (the\n" +
			"\"latest\" is exported), a step-NNNNNNNN directory, or its manifest.json. Every rank file's checksum is verified first. --names hf writes\n" +
			"Hugging Face GPT-2 keys (Conv1D weights transposed to in×out, head tied to wte).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "names", Value: "strata", Usage: "tensor names: strata (the layout's) or hf (Hugging Face GPT-2)"},
			&cli.StringFlag{Name: "dtype", Value: "fp32", Usage: "stored dtype: fp32 or bf16 (round to nearest even)"},
		},
		Action: runExport,
	}
}

func runExport(c *cli.Context) error {
	if c.NArg() != 2 {
		return usagef("export: want CHECKPOINT and OUT.safetensors, got %d arguments", c.NArg())
	}
	src, dst := c.Args().Get(0), c.Args().Get(1)
	opts := checkpoint.ExportOptions{}
	switch n := c.String("names"); n {
	case "strata":
		opts.Names = checkpoint.NamesStrata
	case "hf":
		opts.Names = checkpoint.NamesHF
	default:
		return usagef("export: --names %q (want strata or hf)", n)
	}
	dt, err := dtype.Parse(c.String("dtype"))
	if err != nil || (dt != dtype.F32 && dt != dtype.BF16) {
		return usagef("export: --dtype %q (want fp32 or bf16)", c.String("dtype"))
	}
	opts.DType = dt
	// Streamed: the checkpoint's files are verified, then read and written
	// one chunk at a time.
	dir, _, err := resolveCheckpoint(src)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	st, err := checkpoint.ExportCheckpoint(dst, dir, opts)
	if err != nil {
		return err
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "exported step %d of %s (%d params) to %s (%s, %s names, %s)\n",
		st.Step, src, st.Shape.ParamCount(), dst, dt, opts.Names, units.FormatBytes(fi.Size()))
	return nil
}
