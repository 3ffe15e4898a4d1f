package cmd

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
	"github.com/urfave/cli/v2"
)

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:      "eval",
		Usage:     "mean next-token loss and perplexity of a model on a text file",
		UsageText: "strata eval --model PATH --data FILE [--seq N] [--json] [--backend cpu|cuda] [--hbm BYTES] [--dtype auto|fp32|bf16] [--bos] [--logits OUT] [--chat-template PATH]",
		Description: "Evaluates the model of --model, a Hugging Face model directory (its tokenizer.json) or a Strata run\n" +
			"directory or checkpoint (the tokenizer.json of the source its run recorded, else the byte tokenizer for\n" +
			"a vocabulary of 256), on FILE. The file's tokens t are cut into windows: inputs t[s:s+N], targets\n" +
			"t[s+1:s+N+1] for s = 0, N, 2N, ... (the last window may be shorter), each run from an empty context;\n" +
			"the loss is the mean cross-entropy (natural log) over every predicted token of the file, the\n" +
			"perplexity exp(loss). Prints loss, tokens (predicted) and perplexity; --json one object with keys\n" +
			"loss, tokens, ppl.\n\n" +
			"Weights stored in F32 (or F16) are evaluated in fp32, weights stored in BF16 in bf16 (--dtype\n" +
			"overrides); activations and the key/value cache are fp32. One device (--backend cpu, the default,\n" +
			"or cuda) holds every parameter, uploaded one chunk at a time, and one window's activations: a model\n" +
			"that does not fit is refused, saying what it needs. With --offload cpu or --offload nvme (and --nvme-path)\n" +
			"the weights stay in host RAM or on NVMe and stream through the device as training streams them (an\n" +
			"inference engine: stage 3, every chunk frozen, the tier store's planner bringing each chunk ahead of its\n" +
			"use), --batch windows at a time, the device holding two chunks and a batch's activations (fp32): a model\n" +
			"many times the device's memory evaluates. The windows are the same, the params bf16 (as training's\n" +
			"offloaded params); on the CPU backend the loss is the resident evaluation's (--dtype bf16) bit for bit.\n" +
			"--bos and --logits are for the resident path.\n\n" +
			"The file is read and tokenized about 1 MiB at a time, each block cut before a space that follows a\n" +
			"printable ASCII character, where the GPT-2, Llama-3 and Qwen2 pre-tokenizers split anyway: the ids\n" +
			"are those of the whole file (unless an added token contains such a space). Progress goes to stderr.\n\n" +
			"A JSONL file ({\"text\"}, {\"prompt\", \"completion\"}, {\"messages\"}: by extension .jsonl, else a first\n" +
			"line that is such an object), or Parquet or Arrow (with train's column conventions and --data-columns;\n" +
			"a DatasetDict's validation split, else its test split) is read as train --eval-data reads it: the same tokenizer, special tokens\n" +
			"and chat template (--chat-template, else the one a Strata run recorded, else the model's, else ChatML), its examples packed in file order\n" +
			"into rows of N, each example scored alone, the loss only on the tokens training learns from (the\n" +
			"completions, the assistant's turns): the loss and tokens train --eval-data reports for the same\n" +
			"weights and seq_len. --logits then holds those tokens' rows.",
		Flags: append(inferFlags(),
			&cli.StringFlag{Name: "data", Required: true, Usage: "the text to evaluate on, or examples (JSONL, Parquet or Arrow: a file, a directory or glob of shards, a save_to_disk directory) read as train --eval-data reads them"},
			&cli.StringFlag{Name: "data-columns", Usage: "examples: the names --data holds their fields under, as train's --data-columns"},
			&cli.IntFlag{Name: "seq", Usage: fmt.Sprintf("tokens per window, N (default: a Strata run's seq_len, else the model's max_seq_len, at most %d)", infer.DefaultEvalSeq)},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object: loss, tokens, ppl (and windows, seq, params)"},
			&cli.BoolFlag{Name: "bos", Usage: "put the tokenizer's BOS token before the file's tokens (it is predicted from, not predicted)"},
			&cli.StringFlag{Name: "logits", Usage: "write every predicted token's logits to OUT: little-endian float32, a row of vocab_size values per token, in order"},
			&cli.StringFlag{Name: "offload", Usage: "stream the weights from host RAM (cpu) or NVMe (nvme, with --nvme-path) through the device: a model larger than the device"},
			&cli.StringFlag{Name: "nvme-path", Usage: "--offload nvme: the directory of the swap file (on the drive)"},
			&cli.IntFlag{Name: "batch", Value: 4, Usage: "--offload: windows evaluated together (the weights stream once per batch)"},
			&cli.StringFlag{Name: "chat-template", Usage: "JSONL --data: the chat template of {\"messages\"} lines, as train's (default: the run's, else the model's, else ChatML)"},
		),
		Action: func(c *cli.Context) error { return runEval(c, c.App.Writer, c.App.ErrWriter) },
	}
}

// evalResult is what eval prints (--json: this object).
type evalResult = infer.EvalResult

func runEval(c *cli.Context, stdout, stderr io.Writer) error {
	if err := checkAddressSpace("eval"); err != nil {
		return err
	}
	seq := c.Int("seq")
	if c.IsSet("seq") && seq < 1 {
		return usagef("eval: --seq %d: need at least 1", seq)
	}
	if c.IsSet("offload") {
		return runEvalStreamed(c, seq, stdout, stderr)
	}
	for _, f := range []string{"nvme-path", "batch"} {
		if c.IsSet(f) {
			return usagef("eval: --%s is for --offload (the weights streamed from host RAM or NVMe)", f)
		}
	}
	// Examples (JSONL, Parquet, Arrow) are read as train's --eval-data
	// reads them (evalExamples): a file DetectFormat cannot read is opened
	// as text, which says why.
	path := c.String("data")
	jsonl := false
	f, err := data.DetectFormat(path)
	if errors.Is(err, data.ErrBinary) {
		return fmt.Errorf("eval: --data: %w", err)
	}
	if err == nil && f.Examples() {
		jsonl = true
		if c.Bool("bos") {
			name := map[data.Format]string{data.JSONL: "JSONL", data.Parquet: "Parquet", data.Arrow: "Arrow"}[f]
			return usagef("eval: --bos: --data %s is %s, whose examples take the tokenizer's special tokens as training adds them; --bos is for raw text", path, name)
		}
	}
	in := infer.EvalInput{Name: path}
	if !jsonl {
		if in.Text, err = infer.OpenTokenStream(path, nil); err != nil {
			return fmt.Errorf("eval: --data: %w", err)
		}
		defer in.Text.Close()
	}
	m, err := openInference(c, "eval")
	if err != nil {
		return err
	}
	defer m.Close()
	if seq, err = m.EvalSeq(seq); err != nil {
		return usagef("%v", err)
	}
	if err := loadInference(c, m, model.DecoderOptions{Capacity: seq}, stderr); err != nil {
		return err
	}
	opts := infer.EvalOptions{Seq: seq, BOS: c.Bool("bos")}
	var examples int64
	if jsonl {
		set, src, err := evalExamples(c, m, seq, stderr)
		if err != nil {
			return err
		}
		defer src.Close()
		in.Examples, examples = set, src.Stats.Examples
		opts.Progress = func(p infer.EvalProgress) {
			fmt.Fprintf(stderr, "eval: %d of %d rows of %s, %d tokens, loss so far %.4f\n", p.Rows, p.TotalRows, path, p.Tokens, p.Loss)
		}
	} else {
		opts.Progress = func(p infer.EvalProgress) {
			fmt.Fprintf(stderr, "eval: %.1f%% of %s, %d tokens, %.0f tokens/s, loss so far %.4f\n",
				100*float64(p.Bytes)/float64(max(1, p.SizeBytes)), path, p.Tokens, float64(p.Tokens)/p.Elapsed.Seconds(), p.Loss)
		}
	}
	var logits *bufio.Writer
	var logitsFile *os.File
	if path := c.String("logits"); path != "" {
		if logitsFile, err = os.Create(path); err != nil {
			return fmt.Errorf("eval: --logits: %w", err)
		}
		defer logitsFile.Close()
		logits = bufio.NewWriterSize(logitsFile, 1<<20)
		opts.Logits = logits
	}
	r, err := infer.Evaluate(c.Context, m, in, opts)
	if err != nil {
		return err
	}
	if logits != nil {
		if err := logits.Flush(); err != nil {
			return fmt.Errorf("eval: --logits: %w", err)
		}
		if err := logitsFile.Close(); err != nil {
			return fmt.Errorf("eval: --logits: %w", err)
		}
	}
	if jsonl {
		return printEval(stdout, c.Bool("json"), r, fmt.Sprintf("predicted and trained: the completions' and the assistant's; %d examples in %d rows of %d tokens, as train --eval-data packs them", examples, r.Windows, seq))
	}
	return printEval(stdout, c.Bool("json"), r, "")
}

// printEval prints r: one JSON object, or the loss, the tokens (what
// says what they are; "": windows of text) and the perplexity.
func printEval(stdout io.Writer, asJSON bool, r evalResult, what string) error {
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintf(stdout, "%s\n", b)
		return nil
	}
	if what == "" {
		what = fmt.Sprintf("predicted; windows: %d of at most %d tokens", r.Windows, r.Seq)
	}
	fmt.Fprintf(stdout, "loss        %.6f (nats per token)\n", r.Loss)
	fmt.Fprintf(stdout, "tokens      %d (%s)\n", r.Tokens, what)
	fmt.Fprintf(stdout, "perplexity  %.4f\n", r.PPL)
	return nil
}
