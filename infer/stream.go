package infer

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/gpu"
)

// evaluateStreamed is Evaluate with the weights in host RAM or on NVMe,
// streamed through the device by an inference engine
// (engine.Options.Inference: stage 3, every chunk frozen, the tier store's
// planner bringing each chunk ahead of its use), opts.Batch rows a
// micro-batch; the rows and targets of the data.EvalSet, which cuts text
// into the resident path's windows. The params are bf16 (as training's
// offloaded params).
func evaluateStreamed(ctx context.Context, m *Model, in EvalInput, opts EvalOptions) (EvalResult, error) {
	where := opts.Offload
	if opts.Batch == 0 {
		opts.Batch = 4
	}
	switch {
	case where != config.DeviceCPU && where != config.DeviceNVMe:
		return EvalResult{}, fmt.Errorf("%s: offload %q: want cpu (host RAM) or nvme (with a path)", m.name, where)
	case where == config.DeviceNVMe && opts.NVMePath == "":
		return EvalResult{}, fmt.Errorf("%s: offload nvme needs NVMePath (a directory on the drive)", m.name)
	case opts.BOS || opts.Logits != nil || opts.TokenLosses:
		return EvalResult{}, fmt.Errorf("%s: BOS, logits and per-token losses are for the resident evaluation (without offload)", m.name)
	case in.Examples == nil:
		return EvalResult{}, fmt.Errorf("%s: a streamed evaluation reads Examples (data.NewEvalSet; a text file opened with data.Open gives its windows)", m.name)
	case m.Loaded():
		return EvalResult{}, fmt.Errorf("%s: a streamed evaluation reads the weights from their files; the model is loaded on the device", m.name)
	case opts.Batch < 1:
		return EvalResult{}, fmt.Errorf("%s: batch %d: need at least 1", m.name, opts.Batch)
	}
	if err := m.StreamDType(); err != nil {
		return EvalResult{}, err
	}
	set := in.Examples
	cfg, err := streamEvalConfig(m, set.Seq(), opts.Batch, where, opts.NVMePath)
	if err != nil {
		return EvalResult{}, err
	}
	e, err := engine.New(cfg, m.Devices.Devs, m.Devices.Comms, engine.Options{Init: m.Source.Weights(), Inference: true, Precision: m.DType, HostRegistrar: m.Devices.Registrar})
	if err != nil {
		return EvalResult{}, fmt.Errorf("%s: %w", m.name, err)
	}
	defer e.Close()
	st, err := e.Eval(ctx, set)
	if err != nil {
		return EvalResult{}, fmt.Errorf("%s: %w", m.name, err)
	}
	if st.Tokens == 0 {
		return EvalResult{}, fmt.Errorf("%s: --data %s: nothing to predict", m.name, orDefault(in.Name, "the examples"))
	}
	r := EvalResult{Loss: st.Loss, Tokens: st.Tokens, PPL: math.Exp(st.Loss), Windows: st.Rows, Seq: set.Seq(), Params: m.DType.String(), Duration: st.Duration}
	for _, d := range e.Summary().PerDevice {
		r.DevicePeakBytes = max(r.DevicePeakBytes, d.PeakBytes)
	}
	return r, nil
}

// StreamDType makes the parameter dtype bf16, as a streamed evaluation
// holds them (offloaded params are bf16, as in training); one asked for
// as fp32 (Options.DType) is refused.
func (m *Model) StreamDType() error {
	if m.DType == gpu.BF16 {
		return nil
	}
	if m.dtypeSet {
		return fmt.Errorf("%s: --dtype fp32 with --offload: the engine streams params in bf16 (offloaded params are bf16, as in training)", m.name)
	}
	m.DType, m.DTypeWhy = gpu.BF16, "streamed params are bf16, as training's offloaded params; "+m.DTypeWhy
	return nil
}

// streamEvalConfig is the inference engine's config: stage 3 on one
// device, params (and the optimizer state it never allocates) in host RAM
// or on NVMe, fp32 activations, batch windows
// of seq a micro-batch, every block checkpointed with its input kept in
// host RAM (cpu_checkpointing: the device holds a ring of three block
// inputs and one block's work set, not every block's activations; the
// backward that would read them never runs). A mixture of experts keeps
// every block's activations: its checkpointing is not built.
func streamEvalConfig(m *Model, seq, batch int, where, nvmePath string) (*config.Config, error) {
	path := ""
	if where == config.DeviceNVMe {
		p, _ := json.Marshal(nvmePath)
		path = `, "nvme_path": ` + string(p)
	}
	ckpt := fmt.Sprintf(`
  "activation_checkpointing": {"number_checkpoints": %d, "cpu_checkpointing": true},`, m.Shape().Layers)
	if m.Shape().MoE() {
		ckpt = ""
	}
	js := fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": %d,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": %q%s}, "offload_optimizer": {"device": %q%s}},%s
  "strata": {"model": "eval-model", "devices": 1, "seq_len": %d, "activation_dtype": "fp32"}
}`, batch, where, path, where, path, ckpt, seq)
	s := m.Shape()
	lookup := func(string) (config.Shape, error) { return config.Shape(s), nil }
	cfg, err := config.Parse([]byte(js), "eval --offload", config.Options{LookupShape: lookup})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.name, err)
	}
	return cfg, nil
}
