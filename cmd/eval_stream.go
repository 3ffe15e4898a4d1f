package cmd

import (
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/internal/units"
)

// runEvalStreamed is `strata eval --offload cpu|nvme`: the model's weights
// in host RAM or on NVMe, streamed through one device by an inference
// engine (infer.Evaluate with EvalOptions.Offload), --batch windows a
// micro-batch; the windows, rows and targets of data.EvalSet, which cuts
// them as the resident path does.
func runEvalStreamed(c *cli.Context, seq int, stdout, stderr io.Writer) error {
	where := c.String("offload")
	switch {
	case where != config.DeviceCPU && where != config.DeviceNVMe:
		return usagef("eval: --offload %q: want cpu (host RAM) or nvme (with --nvme-path)", where)
	case where == config.DeviceNVMe && c.String("nvme-path") == "":
		return usagef("eval: --offload nvme needs --nvme-path DIR (a directory on the drive)")
	case where == config.DeviceCPU && c.IsSet("nvme-path"):
		return usagef("eval: --nvme-path is for --offload nvme")
	case c.Bool("bos") || c.IsSet("logits"):
		return usagef("eval: --bos and --logits are for the resident evaluation (without --offload)")
	case c.Int("batch") < 1:
		return usagef("eval: --batch %d: need at least 1", c.Int("batch"))
	}
	m, err := openInference(c, "eval")
	if err != nil {
		return err
	}
	defer m.Close()
	fmt.Fprintf(stderr, "model: %s\n", m.Source.Describe())
	if seq, err = m.EvalSeq(seq); err != nil {
		return usagef("%v", err)
	}
	set, src, err := evalExamples(c, m, seq, stderr)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := m.StreamDType(); err != nil {
		return usagef("%v", err)
	}
	opts := infer.EvalOptions{Seq: seq, Offload: where, NVMePath: c.String("nvme-path"), Batch: c.Int("batch")}
	r, err := infer.Evaluate(c.Context, m, infer.EvalInput{Examples: set, Name: c.String("data")}, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "params %s (%s) streamed from %s through %s, %d windows of %d tokens a pass; activations fp32\n",
		m.DType, m.DTypeWhy, map[string]string{config.DeviceCPU: "host RAM", config.DeviceNVMe: "NVMe (" + c.String("nvme-path") + ")"}[where],
		m.Device.Name(), c.Int("batch"), seq)
	fmt.Fprintf(stderr, "evaluated in %.1fs; device peak %s of %s\n", r.Duration.Seconds(), units.FormatBytes(r.DevicePeakBytes), units.FormatBytes(m.Device.MemStats().BudgetBytes))
	return printEval(stdout, c.Bool("json"), r, "")
}

// evalExamples opens eval's --data as train's --eval-data is opened: read
// by package data with the model's tokenizer (data.Bytes for the byte
// tokenizer, as train reads data without a tokenizer.json) and the chat
// template training would take (runChat: --chat-template, else the
// checkpoint's recorded one, else the Hugging Face source's), under
// --data-columns' names, a DatasetDict's evaluation split; its examples
// packed in file order into rows of seq (data.EvalSet), the loss only on
// the tokens training learns from (the completions, the assistant's
// turns).
func evalExamples(c *cli.Context, m *infer.Model, seq int, stderr io.Writer) (*data.EvalSet, *data.Source, error) {
	chat, err := runChat(c, m.TokenizerSource, m.Source.RecordedChat(), "eval")
	if err != nil {
		return nil, nil, err
	}
	var tok data.Tokenizer = m.Tokenizer
	if m.ByteTokenizer {
		tok = data.Bytes{}
	}
	cols, err := data.ParseColumns(c.String("data-columns"))
	if err != nil {
		return nil, nil, usagef("eval: --data-columns: %v", err)
	}
	t0 := time.Now()
	src, err := data.Open(c.String("data"), data.Options{Tokenizer: tok, Chat: chat, Columns: cols, Splits: data.EvalSplits})
	if err != nil {
		return nil, nil, fmt.Errorf("eval: --data: %w", err)
	}
	set, err := data.NewEvalSet(src, seq)
	if err != nil {
		src.Close()
		return nil, nil, fmt.Errorf("eval: --data: %w", err)
	}
	describeData(stderr, "eval data", src, time.Since(t0))
	return set, src, nil
}
