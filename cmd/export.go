package cmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/tokenizer"
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
	format := c.String("format")
	switch {
	case format != "safetensors" && format != "hf" && format != "peft":
		return usagef("export: --format %q (want safetensors, hf or peft)", format)
	case format != "hf" && c.IsSet("merge"):
		return usagef("export: --merge is for --format hf (the merged model of a LoRA run)")
	case format == "hf" && c.IsSet("names"):
		return usagef("export: --names is for --format safetensors; --format hf writes transformers' names")
	case format != "hf" && c.IsSet("max-shard-size"):
		return usagef("export: --max-shard-size is for --format hf")
	}
	// Streamed: the checkpoint's files are verified, then read and written
	// one chunk at a time.
	dir, _, note, err := resolveCheckpoint(src)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	printNote(c.App.ErrWriter, note)
	switch format {
	case "hf":
		return exportHF(c, src, dir, dst, dt)
	case "peft":
		files, notes, st, err := checkpoint.ExportPEFT(dst, dir, dt)
		for _, n := range notes {
			fmt.Fprintf(c.App.ErrWriter, "note: %s\n", n)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "exported the LoRA adapters of step %d of %s (r %d, alpha %g, %s) to %s: %s (%s)\n",
			st.Step, src, st.LoRA.R, st.LoRA.Alpha, strings.Join(st.LoRA.Targets, ", "), dst, strings.Join(files, ", "), dt)
		return nil
	}
	opts := hf.ExportOptions{DType: dt}
	switch n := c.String("names"); n {
	case "strata":
		opts.Names = hf.NamesStrata
	case "hf":
		opts.Names = hf.NamesHF
	default:
		return usagef("export: --names %q (want strata or hf)", n)
	}
	// A killed export to dst left .DST.tmp-PID-*: removed when provably dead.
	stale, err := durable.RemoveStale(filepath.Dir(filepath.Clean(dst)), filepath.Base(filepath.Clean(dst)))
	for _, n := range stale {
		fmt.Fprintf(c.App.ErrWriter, "note: %s\n", n)
	}
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
		st.Step, src, st.ParamCount(), dst, dt, opts.Names, units.FormatBytes(fi.Size()))
	return nil
}

// exportHF is `strata export --format hf`: the checkpoint at dir (named
// src) as a Hugging Face directory at dst.
func exportHF(c *cli.Context, src, dir, dst string, dt dtype.DType) error {
	maxBytes, err := hf.ParseShardSize(c.String("max-shard-size"))
	if err != nil {
		return usagef("export: --max-shard-size: %v", err)
	}
	m, _, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	switch {
	case m.LoRA != nil && !c.Bool("merge"):
		return usagef("export: %s trained LoRA adapters (strata.lora): --format hf --merge writes the merged model, --format peft the adapters", src)
	case m.LoRA == nil && c.Bool("merge"):
		return usagef("export: --merge: %s has no LoRA adapters to merge (it trained every weight)", src)
	}
	gen, err := generationIDs(m.Source, m.ChatTemplate)
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "note: generation_config.json has only config.json's token ids: %v\n", err)
	}
	out, st, err := checkpoint.ExportHF(dst, dir, hf.DirOptions{DType: dt, MaxShardBytes: maxBytes, Generation: gen})
	if err != nil {
		return err
	}
	for _, n := range out.Notes {
		fmt.Fprintf(c.App.ErrWriter, "note: %s\n", n)
	}
	tok := "no tokenizer files (the run did not start from a Hugging Face directory with them)"
	if len(out.Tokenizer) > 0 {
		tok = "tokenizer files " + strings.Join(out.Tokenizer, ", ")
	}
	chat := "no chat template (the run trained on no {\"messages\"} lines)"
	if m.ChatTemplate != nil {
		chat = "the run's chat template, " + m.ChatTemplate.Source()
	}
	fmt.Fprintf(c.App.Writer, "exported step %d of %s (%d params) to %s: config.json, %d weight file(s) of %s %s (%s); %s; written: %s (%s)\n",
		st.Step, src, st.ParamCount(), dst, len(out.Files), units.FormatBytes(out.TotalBytes), dt, strings.Join(out.Files, ", "), tok,
		strings.Join(out.Written, ", "), chat)
	return nil
}

// generationIDs are the token ids generation_config.json takes from the
// run's tokenizer (the tokenizer.json of source): its BOS and EOS, the
// pad token of its tokenizer_config.json, and the end of turn of the
// run's chat template when that is one token of it. None for a run
// without a tokenizer.json (the byte vocabulary has no special tokens);
// the ids found before an error with it.
func generationIDs(source *hf.Source, chat *data.ChatTemplate) (hf.GenerationIDs, error) {
	var ids hf.GenerationIDs
	p := source.TokenizerPath()
	if p == "" {
		return ids, nil
	}
	tok, err := tokenizer.Load(p)
	if err != nil {
		return ids, err
	}
	if id, ok := tok.BOS(); ok {
		ids.BOS = &id
	}
	if id, ok := tok.EOS(); ok {
		ids.EOS = &id
	}
	if tmpl, err := data.LoadChatTemplate(source.Path); err == nil {
		if pad, ok := tmpl.SpecialTokens()["pad_token"]; ok {
			if id, ok := tok.TokenID(pad); ok {
				ids.Pad = &id
			}
		}
	}
	if chat != nil {
		t, err := data.ParseChatTemplate(chat.Text(), chat.Source(), chat.SpecialTokens())
		if err != nil {
			return ids, err
		}
		eot, err := t.EndOfTurn()
		if err != nil {
			return ids, err
		}
		if id, ok := tok.TokenID(eot); ok {
			ids.EndOfTurn = &id
		}
	}
	return ids, nil
}
