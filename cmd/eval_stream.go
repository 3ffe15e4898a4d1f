package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
)

// runEvalStreamed is `strata eval --offload cpu|nvme`: the model's weights
// in host RAM or on NVMe, streamed through one device by an inference
// engine (engine.Options.Inference: stage 3, every chunk frozen, the tier
// store's planner), --batch windows a micro-batch; the windows, rows and
// targets of data.EvalSet, which cuts them as the resident path does.
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
	m, err := openInference(c, "eval", nil, stderr)
	if err != nil {
		return err
	}
	defer m.close()
	s := m.im.shape
	if seq == 0 {
		seq = min(s.MaxSeq, defaultEvalSeq)
		if n := m.runSeqLen(); n > 0 {
			seq = min(s.MaxSeq, n)
		}
	}
	if seq > s.MaxSeq {
		return usagef("eval: --seq %d is past the model's max_seq_len %d", seq, s.MaxSeq)
	}
	path := c.String("data")
	chat, err := runChat(c, m.source, m.recordedChat(), "eval")
	if err != nil {
		return err
	}
	var tok data.Tokenizer = m.tok
	if m.byteTok {
		tok = data.Bytes{}
	}
	t0 := time.Now()
	src, err := openEvalExamples(c, path, data.Options{Tokenizer: tok, Chat: chat})
	if err != nil {
		return fmt.Errorf("eval: --data: %w", err)
	}
	defer src.Close()
	set, err := data.NewEvalSet(src, seq)
	if err != nil {
		return fmt.Errorf("eval: --data: %w", err)
	}
	describeData(stderr, "eval data", src, time.Since(t0))
	if m.dt != gpu.BF16 {
		if c.String("dtype") == "fp32" {
			return usagef("eval: --dtype fp32 with --offload: the engine streams params in bf16 (offloaded params are bf16, as in training)")
		}
		m.dt, m.dtWhy = gpu.BF16, "streamed params are bf16, as training's offloaded params; "+m.dtWhy
	}
	cfg, err := streamEvalConfig(m, seq, c.Int("batch"), where, c.String("nvme-path"))
	if err != nil {
		return err
	}
	e, err := engine.New(cfg, m.devs.Devs, m.devs.Comms, engine.Options{Init: m.im.src, Inference: true, Precision: m.dt, HostRegistrar: m.devs.Registrar})
	if err != nil {
		return fmt.Errorf("eval: %w", err)
	}
	defer e.Close()
	fmt.Fprintf(stderr, "params %s (%s) streamed from %s through %s, %d windows of %d tokens a pass; activations fp32\n",
		m.dt, m.dtWhy, map[string]string{config.DeviceCPU: "host RAM", config.DeviceNVMe: "NVMe (" + c.String("nvme-path") + ")"}[where],
		m.dev.Name(), c.Int("batch"), seq)
	st, err := e.Eval(context.Background(), set)
	if err != nil {
		return fmt.Errorf("eval: %w", err)
	}
	if st.Tokens == 0 {
		return fmt.Errorf("eval: --data %s: nothing to predict", path)
	}
	sum := e.Summary()
	fmt.Fprintf(stderr, "evaluated in %.1fs; device peak %s of %s\n", st.Duration.Seconds(), units.FormatBytes(devicePeak(sum)), units.FormatBytes(m.dev.MemStats().BudgetBytes))
	r := evalResult{Loss: st.Loss, Tokens: st.Tokens, PPL: math.Exp(st.Loss), Windows: st.Rows, Seq: seq, Params: m.dt.String()}
	if c.Bool("json") {
		b, _ := json.Marshal(r)
		fmt.Fprintf(stdout, "%s\n", b)
		return nil
	}
	fmt.Fprintf(stdout, "loss        %.6f (nats per token)\n", r.Loss)
	fmt.Fprintf(stdout, "tokens      %d (predicted; windows: %d of at most %d tokens)\n", r.Tokens, r.Windows, seq)
	fmt.Fprintf(stdout, "perplexity  %.4f\n", r.PPL)
	return nil
}

// devicePeak is the largest device's peak of all allocations.
func devicePeak(s report.Summary) int64 {
	var n int64
	for _, d := range s.PerDevice {
		n = max(n, d.PeakBytes)
	}
	return n
}

// streamEvalConfig is the inference engine's config: stage 3 on one
// device, params (and the optimizer state it never allocates) in host RAM
// or on NVMe, fp32 activations, batch windows of seq a micro-batch, every
// block checkpointed with its input kept in host RAM (cpu_checkpointing:
// the device holds a ring of three block inputs and one block's work set,
// not every block's activations; the backward that would read them never
// runs).
func streamEvalConfig(m *inferModel, seq, batch int, where, nvmePath string) (*config.Config, error) {
	path := ""
	if where == config.DeviceNVMe {
		p, _ := json.Marshal(nvmePath)
		path = `, "nvme_path": ` + string(p)
	}
	js := fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": %d,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": %q%s}, "offload_optimizer": {"device": %q%s}},
  "activation_checkpointing": {"number_checkpoints": %d, "cpu_checkpointing": true},
  "strata": {"model": "eval-model", "devices": 1, "seq_len": %d, "activation_dtype": "fp32"}
}`, batch, where, path, where, path, m.im.shape.Layers, seq)
	s := m.im.shape
	lookup := func(string) (config.Shape, error) { return config.Shape(s), nil }
	cfg, err := config.Parse([]byte(js), "eval --offload", config.Options{LookupShape: lookup})
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	return cfg, nil
}
