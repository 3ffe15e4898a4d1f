package cmd

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
)

// exportCommand is `strata export CKPT OUT.safetensors`: the model weights of
// a training checkpoint (fp32 master weights when it holds them, else the
// params) gathered from every rank's shards into one safetensors file; with
// --format hf, a Hugging Face model directory.
func exportCommand() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "write a training checkpoint's weights as one safetensors file, or as a Hugging Face model directory",
		UsageText: "strata export [--names strata|hf] [--dtype fp32|bf16] CHECKPOINT OUT.safetensors\n   strata export --format hf [--merge] [--dtype fp32|bf16] [--max-shard-size 5GB] CHECKPOINT OUTDIR\n   strata export --format peft [--dtype fp32|bf16] CHECKPOINT OUTDIR",
		Description: "CHECKPOINT is named as --resume names it: a run's --out directory or its checkpoints/ (the\n" +
			"\"latest\" is exported), a step-NNNNNNNN directory, or its manifest.json. Every rank file's checksum is verified first,\n" +
			"then the weights stream one chunk at a time. --names hf writes Hugging Face GPT-2 keys (Conv1D weights transposed to\n" +
			"in×out, head tied to wte).\n" +
			"--format hf writes OUTDIR (new or empty) as transformers' save_pretrained does: config.json (the architecture's keys,\n" +
			"torch_dtype; a run started with --init from a Hugging Face directory keeps that config.json's other keys), the weights\n" +
			"in files of at most --max-shard-size (model.safetensors, or model-0000N-of-0000M.safetensors with\n" +
			"model.safetensors.index.json) under transformers' names, the tokenizer files of the run's --init directory, the chat template the\n" +
			"run's {\"messages\"} lines were rendered with (chat_template.jinja and tokenizer_config.json's chat_template) and, unless the\n" +
			"source had one, generation_config.json (bos/eos/pad ids of config.json, else of the tokenizer; the template's end-of-turn token\n" +
			"as a second eos). A LoRA run (strata.lora) exports with --merge: every adapted weight W + scaling·B·A, merged a block at a time.\n" +
			"--format peft writes a LoRA run's adapters as PEFT saves them: adapter_model.safetensors (base_model.model.<module>.lora_A/B.weight)\n" +
			"and adapter_config.json (peft_type LORA, r, lora_alpha, target_modules, use_rslora, base_model_name_or_path: the run's --init).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "format", Value: "safetensors", Usage: "safetensors (one file), hf (a Hugging Face model directory) or peft (a LoRA run's adapters)"},
			&cli.BoolFlag{Name: "merge", Usage: "--format hf of a LoRA run: merge the adapters into the base weights"},
			&cli.StringFlag{Name: "names", Value: "strata", Usage: "tensor names of --format safetensors: strata (the layout's) or hf (Hugging Face GPT-2)"},
			&cli.StringFlag{Name: "dtype", Value: "fp32", Usage: "stored dtype: fp32 or bf16 (round to nearest even)"},
			&cli.StringFlag{Name: "max-shard-size", Value: "5GB", Usage: "--format hf: the most tensor bytes per weight file, as transformers reads it (GB = 10^9 B, GiB = 2^30 B)"},
		},
		Action: runExport,
	}
}

func runExport(c *cli.Context) error {
	if c.NArg() != 2 {
		return usagef("export: want CHECKPOINT and OUT, got %d arguments", c.NArg())
	}
	src, dst := c.Args().Get(0), c.Args().Get(1)
	dt, err := dtype.Parse(c.String("dtype"))
	if err != nil || (dt != dtype.F32 && dt != dtype.BF16) {
		return usagef("export: --dtype %q (want fp32 or bf16)", c.String("dtype"))
	}
	opts := checkpoint.ExportOptions{Format: checkpoint.ExportFormat(c.String("format")), Merge: c.Bool("merge"), DType: dt}
	if opts.Format == checkpoint.FormatHF && opts.Merge && !c.IsSet("dtype") {
		opts.DType = 0 // each tensor in its base's dtype, as PEFT's merge keeps it
	}
	switch n := c.String("names"); {
	case opts.Format == checkpoint.FormatSafetensors && n == "strata":
		opts.Names = hf.NamesStrata
	case opts.Format == checkpoint.FormatSafetensors && n == "hf":
		opts.Names = hf.NamesHF
	case opts.Format == checkpoint.FormatSafetensors:
		return usagef("export: --names %q (want strata or hf)", n)
	case opts.Format == checkpoint.FormatHF && c.IsSet("names"):
		opts.Names = hf.NamesHF // refused by Validate: --format hf writes transformers' names
	}
	switch {
	case opts.Format == checkpoint.FormatHF:
		if opts.MaxShardBytes, err = hf.ParseShardSize(c.String("max-shard-size")); err != nil {
			return usagef("export: --max-shard-size: %v", err)
		}
	case c.IsSet("max-shard-size"):
		opts.MaxShardBytes = -1 // refused by Validate: the flag is for --format hf
	}
	if err := opts.Validate(); err != nil {
		return usagef("%v", err)
	}
	// Streamed: the checkpoint's files are verified, then read and written
	// one chunk at a time.
	dir, _, note, err := resolveCheckpoint(src)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	printNote(c.App.ErrWriter, note)
	res, err := checkpoint.Export(c.Context, dir, dst, opts)
	if res != nil {
		for _, n := range res.Notes {
			fmt.Fprintf(c.App.ErrWriter, "note: %s\n", n)
		}
	}
	var oe *checkpoint.OptionError
	switch {
	case errors.As(err, &oe):
		return usagef("%s", oe.Msg)
	case err != nil:
		return err
	}
	return res.WriteText(c.App.Writer, src)
}
