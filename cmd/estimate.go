package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// estimateCommand prints the model-state bytes per device, on the host and
// on NVMe for each ZeRO stage: the arithmetic the engine reports.
func estimateCommand() *cli.Command {
	return &cli.Command{
		Name:      "estimate",
		Usage:     "model-state bytes per device, on the host and on NVMe for ZeRO stages 0-3",
		UsageText: "strata estimate (--model NAME|HF_DIR|RUN | --params N | --config FILE) [--devices N] [--stage S] [--offload-optimizer none|cpu|nvme] [--offload-param none|cpu|nvme] [--freeze PATTERN ...] [--batch B] [--seq T] [--hbm BYTES] [--json]",
		Description: "For mixed-precision Adam (bf16 params and grads, fp32 master, m and v: 16 bytes per parameter),\n" +
			"prints each rank's model state with Strata's padded shard layout, next to the formula of the ZeRO\n" +
			"paper (16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N). For a shape (--model or --config) it then prints each\n" +
			"device's activations per micro-batch of --batch × --seq tokens, term by term, without activation\n" +
			"checkpointing, with it and with cpu_checkpointing, the working set (gathered chunks, gradient\n" +
			"buckets, staged shards), and per stage the total; with --hbm, which configuration fits.\n" +
			"--model names a shape, a Hugging Face model directory or a Strata run directory or checkpoint; a\n" +
			"--config without strata.model needs --model (or --params).\n" +
			"With --config, model, devices, stage, offload devices, host_budget, the stage-3 persistence\n" +
			"threshold and strata.freeze come from the file; flags given explicitly override them.\n" +
			"--freeze (strata.freeze) counts frozen chunks at their params only: no gradient, no master, m, v\n" +
			"(the formula's gradient and optimizer terms are then on Ψₜ, the trainable parameters).",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "model", Usage: "the model's shape: a named one (" + strings.Join(model.Names(), ", ") + "), a Hugging Face model directory (its config.json) or a Strata run directory or checkpoint (the shape it records)"},
			&cli.StringFlag{Name: "params", Usage: `parameter count Ψ instead of a shape ("124M", "1.5B", "7.5e9")`},
			&cli.StringFlag{Name: "config", Usage: "DeepSpeed-style JSON config to take the settings from"},
			&cli.IntFlag{Name: "devices", Usage: "N, devices sharing the model state; decides over strata.devices, as in train (default: from the config, strata.devices; without --config, 1)"},
			&cli.IntFlag{Name: "nodes", Value: 1, Usage: "nodes (processes) of the job, each with --devices devices: N = nodes × devices; host and NVMe are counted per node (each node's budget and drives hold its ranks')"},
			&cli.IntFlag{Name: "stage", Value: -1, Usage: "ZeRO stage 0-3 (default: a table of all stages)"},
			&cli.StringFlag{Name: "offload-optimizer", Value: "none", Usage: "where fp32 master, m and v live: none (device), cpu or nvme"},
			&cli.StringFlag{Name: "offload-param", Value: "none", Usage: "where bf16 param shards live at stage 3: none (device), cpu or nvme"},
			&cli.StringFlag{Name: "host-budget", Usage: `optimizer state kept in host RAM with --offload-optimizer nvme ("8GiB"; default none)`},
			&cli.Int64Flag{Name: "persistence-threshold", Usage: "stage 3: chunks with fewer parameters stay gathered (default 0, or the config's)"},
			&cli.Int64Flag{Name: "align", Value: estimate.DefaultShardAlignElems, Usage: "alignment of each rank's slice of a chunk, in elements (1 = none)"},
			&cli.StringFlag{Name: "moments", Value: "fp32", Usage: "precision of Adam's m and v with the optimizer offloaded: fp32, bf16 or int8 (strata.optimizer_state.moments)"},
			&cli.StringFlag{Name: "master", Usage: "master weights with the optimizer offloaded: fp32 or bf16+remainder (strata.optimizer_state.master; default bf16+remainder with --offload-optimizer nvme, else fp32)"},
			&cli.StringFlag{Name: "host-grad", Value: "bf16", Usage: "dtype of the gradient shard copied to the host when the optimizer is offloaded: bf16 or fp32"},
			&cli.StringFlag{Name: "lora", Usage: `LoRA adapters on a frozen base, as strata.lora: "r=16", with ",alpha=32", ",targets=q_proj+v_proj" (or all-linear), ",rslora", ",base=nf4" or int8 (needs --model or --config)`},
			&cli.StringFlag{Name: "base-dtype", Usage: "with --lora: how the frozen base is stored in its offload tier (strata.lora.base_dtype: bf16, nf4 or int8; the same as --lora ...,base=)"},
			&cli.StringSliceFlag{Name: "freeze", Usage: `tensor-name patterns of the parameters that do not train, as strata.freeze ("wte,wpe" or repeated; needs --model or --config)`},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"},
		}, estimateActFlags()...),
		Action: runEstimate,
	}
}

// estimateFromConfig reads --config: the config and its shape (--devices
// decides over strata.devices, as in train). flagShape is --model's shape
// (nil without --model): it decides over strata.model, and its hidden size
// fills in the config's "auto" values. A config that names no model
// without --model is refused (noModelError) unless --params gives Ψ.
func estimateFromConfig(c *cli.Context, path string, flagShape *model.Shape) (*config.Config, model.Shape, error) {
	devices := 0
	if c.IsSet("devices") {
		devices = c.Int("devices")
	}
	named, _ := configNamesModel(path) // a file that does not read: config.Load says so
	lookup := model.LookupConfigShape
	if flagShape != nil {
		lookup = func(string) (config.Shape, error) { return config.Shape(*flagShape), nil }
	}
	cfg, err := config.Load(path, config.Options{Devices: devices, LookupShape: lookup})
	if err != nil {
		return nil, model.Shape{}, err
	}
	if !named && flagShape == nil && !c.IsSet("params") {
		return nil, model.Shape{}, noModelError(path)
	}
	printConfigNotes(c.App.ErrWriter, cfg.Ignored())
	if flagShape != nil {
		cfg.ResolveModel(config.Shape(*flagShape)) // an explicit strata.model shape, too
	}
	if cfg.Shape() == nil {
		return nil, model.Shape{}, fmt.Errorf("estimate: %s: strata.model has no shape", path)
	}
	s := model.Shape(*cfg.Shape())
	if s.Name == "" {
		s.Name = "config"
	}
	return cfg, s, nil
}

// estimateRequest is the request of the flags: the config's
// (estimate.RequestFromConfig) with the flags given explicitly over it,
// or the flags' alone.
func estimateRequest(c *cli.Context) (estimate.Request, error) {
	if c.IsSet("model") && c.IsSet("params") {
		return estimate.Request{}, usagef("estimate: give --model or --params, not both")
	}
	var flagShape *model.Shape
	if c.IsSet("model") {
		s, err := estimateShape(c.String("model"))
		if err != nil {
			return estimate.Request{}, err
		}
		if _, err := model.NewLayout(s); err != nil {
			return estimate.Request{}, usagef("estimate: --model %s: %v", c.String("model"), err)
		}
		flagShape = &s
	}
	req := estimate.Request{Options: estimate.Options{Devices: config.Default().Strata.Devices}, Stage: c.Int("stage")}
	path := c.String("config")
	var cfg *config.Config
	if path != "" {
		var s model.Shape
		var err error
		if cfg, s, err = estimateFromConfig(c, path, flagShape); err != nil {
			return req, err
		}
		if req, err = estimate.RequestFromConfig(cfg, s); err != nil {
			return req, err
		}
		if c.IsSet("stage") {
			req.Stage = c.Int("stage")
		}
	}
	req.Options.ShardAlignElems = c.Int64("align")
	switch {
	case flagShape != nil:
		req.Shape = flagShape
	case c.IsSet("params"):
		psi, err := estimate.ParseParamCount(c.String("params"))
		if err != nil {
			return req, usagef("estimate: --params: %v", err)
		}
		req.Shape, req.Params, req.LoRA = nil, psi, nil
	case cfg == nil:
		return req, usagef("estimate: give --model (NAME, HF_DIR or RUN), --params N or --config FILE (models: %s)", strings.Join(model.Names(), ", "))
	}
	if err := estimateOptionFlags(c, &req.Options, cfg == nil); err != nil {
		return req, err
	}
	if c.IsSet("freeze") {
		req.Freeze = c.StringSlice("freeze")
	}
	if err := estimateLoRA(c, &req); err != nil {
		return req, err
	}
	estimateActivationFlags(c, &req.Activations, cfg == nil)
	return req, nil
}

// estimateOptionFlags sets o from the model-state flags: those given, and
// without a config (all) their defaults.
func estimateOptionFlags(c *cli.Context, o *estimate.Options, all bool) error {
	if c.IsSet("devices") {
		o.Devices = c.Int("devices")
	}
	var err error
	if c.IsSet("offload-optimizer") || all {
		if o.OptimizerTier, err = shard.ParseTier(c.String("offload-optimizer")); err != nil {
			return usagef("estimate: --offload-optimizer: %v", err)
		}
	}
	if c.IsSet("offload-param") || all {
		if o.ParamTier, err = shard.ParseTier(c.String("offload-param")); err != nil {
			return usagef("estimate: --offload-param: %v", err)
		}
	}
	if c.IsSet("host-budget") {
		if o.HostBudgetBytes, err = units.ParseBytes(c.String("host-budget")); err != nil {
			return usagef("estimate: --host-budget: %v", err)
		}
	}
	if c.IsSet("persistence-threshold") {
		o.PersistenceThreshold = c.Int64("persistence-threshold")
	}
	if c.IsSet("moments") || all {
		if o.MomentsDType, err = estimate.ParseMoments(c.String("moments")); err != nil {
			return usagef("estimate: --moments %q is not fp32, bf16 or int8", c.String("moments"))
		}
	}
	if c.IsSet("master") || all {
		if o.MasterDType, err = estimate.ParseMaster(c.String("master")); err != nil {
			return usagef("estimate: --master %q is not fp32 or bf16+remainder", c.String("master"))
		}
	}
	switch g := c.String("host-grad"); g {
	case "bf16":
		o.HostGradDType = dtype.BF16
	case "fp32", "f32":
		o.HostGradDType = dtype.F32
	default:
		return usagef("estimate: --host-grad %q is not bf16 or fp32", g)
	}
	if o.Devices < 1 || o.ShardAlignElems < 1 {
		return usagef("estimate: --devices and --align must be at least 1")
	}
	if nodes := c.Int("nodes"); nodes < 1 {
		return usagef("estimate: --nodes %d: at least 1", nodes)
	} else if nodes > 1 {
		o.LocalDevices, o.Devices = o.Devices, nodes*o.Devices
	}
	return nil
}

// estimateActivationFlags sets a from the activation flags: those given,
// and without a config (all) their defaults.
func estimateActivationFlags(c *cli.Context, a *estimate.ActivationRequest, all bool) {
	for _, f := range []struct {
		name string
		dst  *int
	}{{"batch", &a.Micro}, {"seq", &a.Seq}, {"accum", &a.Accum}, {"checkpoints", &a.Checkpoints}} {
		if all || c.IsSet(f.name) {
			*f.dst = c.Int(f.name)
		}
	}
	if all || c.IsSet("activation-dtype") {
		a.DType = c.String("activation-dtype")
	}
}

func runEstimate(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("estimate: unexpected argument %q", c.Args().First())
	}
	req, err := estimateRequest(c)
	if err != nil {
		return err
	}
	if c.IsSet("hbm") {
		b, err := units.ParseBytes(c.String("hbm"))
		if err != nil || b < 1 {
			return usagef("estimate: --hbm %q is not a byte size such as 80GiB", c.String("hbm"))
		}
		req.Activations.BudgetBytes = b
	}
	if a := req.Activations; req.Shape != nil && (a.Micro < 1 || a.Accum < 1) {
		return usagef("estimate: --batch %d and --accum %d must be at least 1", a.Micro, a.Accum)
	}
	rep, err := estimate.New(req)
	if err != nil {
		return estimateError(c, req, err)
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(rep.JSON())
	}
	return rep.WriteText(c.App.Writer)
}

// estimateError says what of the flags (or the config's keys) a refused
// request names: a usage error.
func estimateError(c *cli.Context, req estimate.Request, err error) error {
	var re *estimate.RequestError
	if !errors.As(err, &re) {
		return err
	}
	o, a := req.Options, req.Activations
	if a.Seq == 0 && req.Shape != nil {
		a.Seq = req.Shape.MaxSeq
	}
	switch re.Input {
	case estimate.InputSize:
		return usagef("estimate: --align %d on --devices %d: the model state's sizes pass 2^63 bytes (8 EiB) and would wrap; use a smaller --align or fewer --devices", o.ShardAlignElems, o.Devices)
	case estimate.InputMoments:
		return usagef("estimate: --moments %s needs --offload-optimizer cpu or nvme (narrow moments are the host optimizer's)", c.String("moments"))
	case estimate.InputMaster:
		return usagef("estimate: --master %s needs --offload-optimizer cpu or nvme (the remainder is the host optimizer's)", c.String("master"))
	case estimate.InputFreeze:
		return usagef("estimate: --freeze (or strata.freeze) matches tensor names: give --model or --config, not --params")
	case estimate.InputFreezePatterns:
		return fmt.Errorf("estimate: --freeze: %w", errors.Unwrap(re.Err))
	case estimate.InputLoRAFreeze:
		return usagef("estimate: --lora with --freeze (or strata.freeze): LoRA freezes the whole base already")
	case estimate.InputLoRABase:
		return usagef("estimate: a %s base streams from host RAM or NVMe: give --stage 3 and --offload-param cpu or nvme", req.LoRA.Base)
	case estimate.InputLoRA:
		if u := errors.Unwrap(re.Err); u != nil {
			return usagef("estimate: --lora: %v", u)
		}
	case estimate.InputSeq:
		return usagef("estimate: --seq %d: want 1 to the model's max_seq_len %d", a.Seq, req.Shape.MaxSeq)
	case estimate.InputCheckpoints:
		return usagef("estimate: --checkpoints %d: want 1 to the model's %d blocks (0: every block)", a.Checkpoints, req.Shape.Layers)
	case estimate.InputActivationDType:
		return usagef("estimate: --activation-dtype %q is not bf16 or fp32", a.DType)
	case estimate.InputActivations:
		batch, seq := "--batch", "--seq"
		if !c.IsSet("batch") && c.String("config") != "" {
			batch = "train_micro_batch_size_per_gpu"
		}
		if !c.IsSet("seq") && c.String("config") != "" && req.Activations.Seq != 0 {
			seq = "strata.seq_len"
		}
		return usagef("estimate: %s %d × %s %d tokens a micro-batch: the activation sizes pass 2^63 bytes (8 EiB) and would wrap; use a smaller %s", batch, a.Micro, seq, a.Seq, batch)
	}
	return usagef("%v", err)
}

// estimateLoRA sets r.LoRA from --lora ("r=16,alpha=32,targets=a+b,rslora")
// and --base-dtype; without them r keeps the config's strata.lora. The
// targets default as strata.lora's.
func estimateLoRA(c *cli.Context, r *estimate.Request) error {
	if !c.IsSet("lora") {
		if c.IsSet("base-dtype") {
			return usagef("estimate: --base-dtype is the frozen base's storage under --lora")
		}
		return nil
	}
	if r.Shape == nil {
		return usagef("estimate: --lora adapts a model's linears: give --model or --config, not --params")
	}
	lc, err := estimate.ParseLoRA(c.String("lora"))
	if err != nil {
		return usagef("estimate: --lora %q: %v", c.String("lora"), err)
	}
	if v := c.String("base-dtype"); c.IsSet("base-dtype") {
		if v != config.BaseBF16 && v != config.BaseNF4 && v != config.BaseInt8 {
			return usagef("estimate: --base-dtype %q is not bf16, nf4 or int8", v)
		}
		lc.BaseDType = v
	}
	cfgLoRA := &config.Config{}
	cfgLoRA.Strata.LoRA = lc
	r.LoRA = estimate.LoRAFromConfig(cfgLoRA, *r.Shape)
	r.LoRA.Base = estimate.BaseDType(lc.BaseDType) // estimate.New validates it against the shape
	return nil
}

func estimateActFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "batch", Value: 1, Usage: "micro-batch: sequences per device (train_micro_batch_size_per_gpu)"},
		&cli.IntFlag{Name: "seq", Usage: "tokens per sequence (strata.seq_len; default the model's max_seq_len)"},
		&cli.IntFlag{Name: "accum", Value: 1, Usage: "micro-batches per step (gradient_accumulation_steps): the gradient shards bound for the host with the optimizer on NVMe"},
		&cli.StringFlag{Name: "hbm", Usage: `device memory budget ("80GiB", strata.hbm_bytes): says which configuration fits`},
		&cli.StringFlag{Name: "activation-dtype", Value: config.ActivationBF16, Usage: "bf16 or fp32 (strata.activation_dtype)"},
		&cli.IntFlag{Name: "checkpoints", Usage: "activation_checkpointing.number_checkpoints: blocks recomputed (default every block)"},
	}
}
