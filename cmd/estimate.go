package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

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
			&cli.StringFlag{Name: "master", Value: "fp32", Usage: "master weights with the optimizer offloaded: fp32 or bf16+remainder (strata.optimizer_state.master)"},
			&cli.StringFlag{Name: "host-grad", Value: "bf16", Usage: "dtype of the gradient shard copied to the host when the optimizer is offloaded: bf16 or fp32"},
			&cli.StringFlag{Name: "lora", Usage: `LoRA adapters on a frozen base, as strata.lora: "r=16", with ",alpha=32", ",targets=q_proj+v_proj" (or all-linear), ",rslora", ",base=nf4" or int8 (needs --model or --config)`},
			&cli.StringFlag{Name: "base-dtype", Usage: "with --lora: how the frozen base is stored in its offload tier (strata.lora.base_dtype: bf16, nf4 or int8; the same as --lora ...,base=)"},
			&cli.StringSliceFlag{Name: "freeze", Usage: `tensor-name patterns of the parameters that do not train, as strata.freeze ("wte,wpe" or repeated; needs --model or --config)`},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"},
		}, estimateActFlags()...),
		Action: runEstimate,
	}
}

// estimateFromConfig reads --config: the config, its shape and the memory
// options it gives (--devices decides over strata.devices, as in train;
// its stage becomes --stage unless that is given). flagShape is --model's
// shape (nil without --model): it decides over strata.model, and its hidden
// size fills in the config's "auto" values. A config that names no model
// without --model is refused (noModelError) unless --params gives Ψ.
func estimateFromConfig(c *cli.Context, path string, flagShape *model.Shape) (*config.Config, *model.Shape, estimate.Options, error) {
	devices := 0
	if c.IsSet("devices") {
		devices = c.Int("devices")
	}
	named, _ := configNamesModel(path) // a file that does not read: config.Load says so
	lookup := lookupShape
	if flagShape != nil {
		lookup = func(string) (config.Shape, error) { return config.Shape(*flagShape), nil }
	}
	cfg, err := config.Load(path, config.Options{Devices: devices, LookupShape: lookup})
	if err != nil {
		return nil, nil, estimate.Options{}, err
	}
	if !named && flagShape == nil && !c.IsSet("params") {
		return nil, nil, estimate.Options{}, noModelError(path)
	}
	printConfigNotes(c.App.ErrWriter, cfg.Ignored())
	if flagShape != nil {
		cfg.ResolveModel(config.Shape(*flagShape)) // an explicit strata.model shape, too
	}
	if cfg.Shape() == nil {
		return nil, nil, estimate.Options{}, fmt.Errorf("estimate: %s: strata.model has no shape", path)
	}
	s := model.Shape(*cfg.Shape())
	if s.Name == "" {
		s.Name = "config"
	}
	l, err := model.NewLayout(s)
	if err != nil {
		return nil, nil, estimate.Options{}, fmt.Errorf("estimate: %s: %w", path, err)
	}
	opts, err := estimate.OptionsFromConfig(cfg, l)
	if err != nil {
		return nil, nil, estimate.Options{}, err
	}
	opts.ShardAlignElems = c.Int64("align")
	if !c.IsSet("stage") {
		c.Set("stage", strconv.Itoa(cfg.ZeRO.Stage))
	}
	return cfg, &s, opts, nil
}

func runEstimate(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("estimate: unexpected argument %q", c.Args().First())
	}
	opts := estimate.Options{Devices: 1, ShardAlignElems: c.Int64("align")}
	var shape *model.Shape
	var cfg *config.Config
	var freeze []string // strata.freeze, then --freeze
	what := ""
	if c.IsSet("model") && c.IsSet("params") {
		return usagef("estimate: give --model or --params, not both")
	}
	var flagShape *model.Shape
	if c.IsSet("model") {
		s, err := estimateShape(c.String("model"))
		if err != nil {
			return err
		}
		flagShape = &s
	}
	if path := c.String("config"); path != "" {
		var err error
		if cfg, shape, opts, err = estimateFromConfig(c, path, flagShape); err != nil {
			return err
		}
		freeze = cfg.Strata.Freeze
	}
	switch {
	case flagShape != nil:
		s := *flagShape
		l, err := model.NewLayout(s)
		if err != nil {
			return usagef("estimate: --model %s: %v", c.String("model"), err)
		}
		shape = &s
		opts.ChunkParams = estimate.ChunkParams(l)
	case c.IsSet("params"):
		psi, err := parseParamCount(c.String("params"))
		if err != nil {
			return usagef("estimate: --params: %v", err)
		}
		shape = nil
		opts.ChunkParams = []int64{psi}
		what = fmt.Sprintf("Ψ = %s parameters as one chunk", groupDigits(psi))
	case shape == nil:
		return usagef("estimate: give --model (NAME, HF_DIR or RUN), --params N or --config FILE (models: %s)", strings.Join(model.Names(), ", "))
	}
	if shape != nil {
		what = fmt.Sprintf("%s: Ψ = %s parameters in %d chunks", shape, groupDigits(shape.ParamCount()), len(opts.ChunkParams))
	}
	if c.IsSet("devices") {
		opts.Devices = c.Int("devices")
	} else if c.String("config") == "" {
		opts.Devices = config.Default().Strata.Devices
	}
	var err error
	if c.IsSet("offload-optimizer") || c.String("config") == "" {
		if opts.OptimizerTier, err = parseDevice(c.String("offload-optimizer")); err != nil {
			return usagef("estimate: --offload-optimizer: %v", err)
		}
	}
	if c.IsSet("offload-param") || c.String("config") == "" {
		if opts.ParamTier, err = parseDevice(c.String("offload-param")); err != nil {
			return usagef("estimate: --offload-param: %v", err)
		}
	}
	if c.IsSet("host-budget") {
		if opts.HostBudgetBytes, err = units.ParseBytes(c.String("host-budget")); err != nil {
			return usagef("estimate: --host-budget: %v", err)
		}
	}
	if c.IsSet("persistence-threshold") {
		opts.PersistenceThreshold = c.Int64("persistence-threshold")
	}
	if c.IsSet("moments") || c.String("config") == "" {
		if opts.MomentsDType, err = estimate.ParseMoments(c.String("moments")); err != nil {
			return usagef("estimate: --moments %q is not fp32, bf16 or int8", c.String("moments"))
		}
		if opts.MomentsDType != dtype.F32 && opts.OptimizerTier == shard.HBM {
			return usagef("estimate: --moments %s needs --offload-optimizer cpu or nvme (narrow moments are the host optimizer's)", c.String("moments"))
		}
	}
	if c.IsSet("master") || c.String("config") == "" {
		if opts.MasterDType, err = estimate.ParseMaster(c.String("master")); err != nil {
			return usagef("estimate: --master %q is not fp32 or bf16+remainder", c.String("master"))
		}
		if opts.MasterDType != dtype.F32 && opts.OptimizerTier == shard.HBM {
			return usagef("estimate: --master %s needs --offload-optimizer cpu or nvme (the remainder is the host optimizer's)", c.String("master"))
		}
	}
	switch g := c.String("host-grad"); g {
	case "bf16":
		opts.HostGradDType = dtype.BF16
	case "fp32", "f32":
		opts.HostGradDType = dtype.F32
	default:
		return usagef("estimate: --host-grad %q is not bf16 or fp32", g)
	}
	if opts.Devices < 1 || opts.ShardAlignElems < 1 {
		return usagef("estimate: --devices and --align must be at least 1")
	}
	if nodes := c.Int("nodes"); nodes < 1 {
		return usagef("estimate: --nodes %d: at least 1", nodes)
	} else if nodes > 1 {
		opts.LocalDevices, opts.Devices = opts.Devices, nodes*opts.Devices
	}
	if err := estimate.CheckSize(opts); err != nil {
		return usagef("estimate: --align %d on --devices %d: the model state's sizes pass 2^63 bytes (8 EiB) and would wrap; use a smaller --align or fewer --devices", opts.ShardAlignElems, opts.Devices)
	}
	if c.IsSet("freeze") {
		freeze = c.StringSlice("freeze")
	}
	lora, err := estimateLoRA(c, cfg, shape)
	if err != nil {
		return err
	}
	if lora != nil && len(freeze) > 0 {
		return usagef("estimate: --lora with --freeze (or strata.freeze): LoRA freezes the whole base already")
	}
	if err := estimateFreeze(&opts, shape, freeze); err != nil {
		return err
	}
	if lora != nil {
		base, _ := model.NewLayout(*shape)
		l, err := base.WithLoRA(*lora)
		if err != nil {
			return usagef("estimate: --lora: %v", err)
		}
		opts.ChunkParams = estimate.ChunkParams(l)
		if opts.Frozen, err = estimate.FrozenChunks(l, nil); err != nil {
			return err
		}
		if lora.Base != 0 {
			if opts.Stage != 3 && c.Int("stage") != 3 || opts.ParamTier == shard.HBM {
				return usagef("estimate: a %s base streams from host RAM or NVMe: give --stage 3 and --offload-param cpu or nvme", lora.Base)
			}
			opts.FrozenParamDType = lora.Base
		}
		adapters := l.ParamCount() - base.ParamCount()
		stored := "bf16"
		if lora.Base != 0 {
			stored = lora.Base.String() + " in " + opts.ParamTier.String()
		}
		what += fmt.Sprintf("\nLoRA r %d, alpha %g on %s: the base (%s parameters) frozen, params only (%s); adapters Ψₐ = %s trainable (%.3f%% of the base) in %d chunks",
			lora.R, lora.Alpha, strings.Join(lora.Targets, ", "), groupDigits(base.ParamCount()), stored, groupDigits(adapters),
			100*float64(adapters)/float64(base.ParamCount()), len(l.Chunks)-len(base.Chunks))
	}
	if f := opts.Frozen; f != nil && shape != nil && lora == nil {
		l, _ := model.NewLayout(*shape) // valid: the frozen chunks were resolved over it
		what += fmt.Sprintf("\nfrozen: %s (%s parameters, %.1f%%) keep their params only; Ψₜ = %s trainable",
			estimate.DescribeChunks(l, f), groupDigits(estimate.FrozenParams(l, f)), 100*float64(estimate.FrozenParams(l, f))/float64(l.ParamCount()),
			groupDigits(l.ParamCount()-estimate.FrozenParams(l, f)))
	}

	var stages []estimate.Stage
	if s := c.Int("stage"); s >= 0 {
		o := opts
		o.Stage = s
		e, err := estimate.Memory(o)
		if err != nil {
			return usagef("%v", err)
		}
		stages = []estimate.Stage{{Stage: s, ModelState: e}}
	} else {
		stages = estimate.Stages(opts)
	}
	var act *actEstimate
	if shape != nil {
		var err error
		if act, err = newActEstimate(c, cfg, *shape, lora); err != nil {
			return err
		}
	}
	if c.Bool("json") {
		name := ""
		var ja *jsonActivations
		if shape != nil {
			name = shape.Name
			ja = act.json(stages)
		}
		return printEstimateJSON(c.App.Writer, name, what, opts, stages, ja)
	}
	w := c.App.Writer
	printEstimate(w, what, opts, stages, c.Int("stage") >= 0)
	if act == nil {
		fmt.Fprintln(w, "not included: activations and the working set (they need a shape: --model or --config)")
		return nil
	}
	act.print(w, stages)
	return nil
}

// estimateLoRA is the adapters of --lora ("r=16,alpha=32,targets=a+b,rslora"),
// else of the config's strata.lora, nil when neither; the targets
// default as strata.lora's.
func estimateLoRA(c *cli.Context, cfg *config.Config, shape *model.Shape) (*model.LoRA, error) {
	if !c.IsSet("lora") {
		if c.IsSet("base-dtype") {
			return nil, usagef("estimate: --base-dtype is the frozen base's storage under --lora")
		}
		if cfg == nil || cfg.Strata.LoRA == nil || shape == nil {
			return nil, nil
		}
		o := estimate.LoRAFromConfig(cfg, *shape)
		o.Base = estimate.BaseDType(cfg.Strata.LoRA.BaseDType)
		return o, nil
	}
	if shape == nil {
		return nil, usagef("estimate: --lora adapts a model's linears: give --model or --config, not --params")
	}
	lc := &config.LoRA{R: 8, Alpha: 8} // PEFT's defaults, as strata.lora
	for _, kv := range strings.Split(c.String("lora"), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		var err error
		switch k {
		case "r":
			lc.R, err = strconv.Atoi(v)
		case "alpha":
			lc.Alpha, err = strconv.ParseFloat(v, 64)
		case "targets":
			lc.TargetModules = strings.Split(v, "+")
		case "rslora":
			lc.UseRSLoRA = true
		case "base":
			if v != config.BaseBF16 && v != config.BaseNF4 && v != config.BaseInt8 {
				return nil, usagef("estimate: --lora %q: base=%q is not bf16, nf4 or int8", c.String("lora"), v)
			}
			lc.BaseDType = v
		default:
			return nil, usagef("estimate: --lora %q: %q is not r, alpha, targets, rslora or base", c.String("lora"), kv)
		}
		if err != nil {
			return nil, usagef("estimate: --lora %q: %s=%q is not a number", c.String("lora"), k, v)
		}
	}
	if lc.R < 1 || !(lc.Alpha > 0) {
		return nil, usagef("estimate: --lora %q: r must be >= 1 and alpha > 0", c.String("lora"))
	}
	if v := c.String("base-dtype"); c.IsSet("base-dtype") {
		if v != config.BaseBF16 && v != config.BaseNF4 && v != config.BaseInt8 {
			return nil, usagef("estimate: --base-dtype %q is not bf16, nf4 or int8", v)
		}
		lc.BaseDType = v
	}
	cfgLoRA := &config.Config{}
	cfgLoRA.Strata.LoRA = lc
	o := estimate.LoRAFromConfig(cfgLoRA, *shape)
	o.Base = estimate.BaseDType(lc.BaseDType)
	if err := o.Validate(*shape); err != nil {
		return nil, usagef("estimate: --lora: %v", err)
	}
	return o, nil
}

// estimateFreeze sets o.Frozen from the patterns (strata.freeze, or
// --freeze) over shape's tensor names (estimate.FrozenChunks: the rule and
// the errors of strata.freeze), after --model may have changed the shape.
func estimateFreeze(o *estimate.Options, shape *model.Shape, patterns []string) error {
	o.Frozen = nil
	if len(patterns) == 0 {
		return nil
	}
	if shape == nil {
		return usagef("estimate: --freeze (or strata.freeze) matches tensor names: give --model or --config, not --params")
	}
	l, err := model.NewLayout(*shape)
	if err != nil {
		return fmt.Errorf("estimate: %w", err)
	}
	if o.Frozen, err = estimate.FrozenChunks(l, patterns); err != nil {
		return fmt.Errorf("estimate: --freeze: %w", err)
	}
	return nil
}

// parseDevice reads DeepSpeed's offload device names.
func parseDevice(s string) (shard.Tier, error) {
	switch s {
	case config.DeviceNone:
		return shard.HBM, nil
	case config.DeviceCPU:
		return shard.Host, nil
	case config.DeviceNVMe:
		return shard.NVMe, nil
	}
	return 0, fmt.Errorf("%q is not none, cpu or nvme", s)
}

// parseParamCount reads "124M", "1.5B", "7.5e9", "350000" (decimal suffixes
// K, M, B or G, T, as parameter counts are written).
func parseParamCount(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	if n := len(t); n > 0 {
		switch strings.ToUpper(t[n-1:]) {
		case "K":
			mult = 1e3
		case "M":
			mult = 1e6
		case "B", "G":
			mult = 1e9
		case "T":
			mult = 1e12
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a positive parameter count (such as 124M, 1.5B or 7.5e9)", s)
	}
	v := math.Round(f * mult)
	if v < 1 || v > 1e15 {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return int64(v), nil
}

func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// machine turns a per-rank formula into the formula for all N ranks.
func machine(c estimate.Coef, n int) estimate.Coef {
	return estimate.Coef{Full: c.Full*float64(n) + c.PerN, TrainFull: c.TrainFull*float64(n) + c.TrainPerN}
}

// node is c (one rank's) summed over one node's l ranks of the job's n:
// each node holds 1/(n/l) of the sharded terms.
func node(c estimate.Coef, l, n int) estimate.Coef {
	nodes := float64(n / l)
	return estimate.Coef{Full: c.Full*float64(l) + c.PerN/nodes, TrainFull: c.TrainFull*float64(l) + c.TrainPerN/nodes}
}

func tierWord(t shard.Tier) string {
	switch t {
	case shard.Host:
		return "host (cpu)"
	case shard.NVMe:
		return "nvme"
	}
	return "device (none)"
}

func printEstimate(w io.Writer, what string, o estimate.Options, stages []estimate.Stage, breakdown bool) {
	fmt.Fprintf(w, "%s\n", what)
	nodes := o.Devices / o.Local()
	if nodes > 1 {
		fmt.Fprintf(w, "N = %d devices (%d nodes × %d); optimizer state on %s; param shards on %s", o.Devices, nodes, o.Local(), tierWord(o.OptimizerTier), tierWord(o.ParamTier))
	} else {
		fmt.Fprintf(w, "N = %d devices; optimizer state on %s; param shards on %s", o.Devices, tierWord(o.OptimizerTier), tierWord(o.ParamTier))
	}
	if o.OptimizerTier != shard.HBM {
		fmt.Fprintf(w, "; reduced gradient shards copied to the host in %s", o.HostGradDType)
	}
	if o.HostBudgetBytes > 0 {
		fmt.Fprintf(w, "; host_budget %s", units.FormatBytes(o.HostBudgetBytes))
	}
	fmt.Fprintln(w)
	master := "fp32 master"
	if o.StateDType(shard.Master) == dtype.Rem16 {
		master = "master as the bf16 param + a 16-bit remainder and a bit"
	}
	if md := o.StateDType(shard.AdamM); md == dtype.F32 && master == "fp32 master" {
		fmt.Fprintf(w, "mixed-precision Adam: bf16 params and grads, fp32 master, m, v (16 B/param)")
	} else {
		fmt.Fprintf(w, "mixed-precision Adam: bf16 params and grads, %s, %s m and v (%.4g B/param of optimizer state, %.4g in all)", master, estimate.MomentsName(md), o.OptimizerBytesPerParam(), 4+o.OptimizerBytesPerParam())
	}
	fmt.Fprintf(w, "; each rank's slice of a chunk padded to %d elements\n\n", o.ShardAlignElems)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	frozen := o.Frozen != nil
	head := "stage\tper device\tformula\thost (all ranks)\tformula\tnvme (all ranks)\tformula"
	if nodes > 1 {
		head = "stage\tper device\tformula\thost (per node)\tformula\tnvme (per node)\tformula"
	}
	if frozen {
		head += "\tnot kept, frozen (device, host, nvme)"
	}
	fmt.Fprintln(tw, head)
	var notes []string
	for _, s := range stages {
		if s.Err != nil {
			fmt.Fprintf(tw, "%d\tn/a\t\tn/a\t\tn/a\t\n", s.Stage)
			notes = append(notes, fmt.Sprintf("stage %d: %s", s.Stage, strings.TrimPrefix(s.Err.Error(), "engine: estimate: ")))
			continue
		}
		n := o.Devices
		dev := units.FormatBytes(s.DeviceBytes())
		if s.DeviceBytes() >= 100e6 {
			dev += fmt.Sprintf(" (%.1f GB)", float64(s.DeviceBytes())/1e9)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s", s.Stage, dev, s.TierFormula(shard.HBM),
			units.FormatBytes(s.NodeHostBytes()), node(s.TierFormula(shard.Host), o.Local(), n),
			units.FormatBytes(s.NodeNVMeBytes()), node(s.TierFormula(shard.NVMe), o.Local(), n))
		if frozen {
			fmt.Fprintf(tw, "\t%s, %s, %s", units.FormatBytes(s.FrozenSavedBytes(shard.HBM)/int64(n)),
				units.FormatBytes(s.FrozenSavedBytes(shard.Host)), units.FormatBytes(s.FrozenSavedBytes(shard.NVMe)))
		}
		fmt.Fprintln(tw)
		for _, note := range s.Notes {
			notes = append(notes, fmt.Sprintf("stage %d: %s", s.Stage, note))
		}
	}
	tw.Flush()
	if ok := okStage(stages); ok != nil {
		pad := float64(ok.RankElems*int64(o.Devices)-ok.Params) / float64(ok.Params) * 100
		fmt.Fprintf(w, "\npadding: %s elements per gathered copy beyond Ψ (%+.3f%%); Ψ = %s\n",
			groupDigits(ok.PaddedElems-ok.Params), pad, groupDigits(ok.Params))
	}
	if breakdown {
		for _, s := range stages {
			if s.Err != nil {
				continue
			}
			fmt.Fprintf(w, "\nstage %d, one rank, by state:\n", s.Stage)
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "state\tdevice\thost\tnvme\tformula")
			for st := range shard.StateCount {
				if shard.State(st) == shard.Activation {
					continue // not model state: the activation section
				}
				var fs []string
				for t := range shard.TierCount {
					if f := s.Formula[st][t]; f != (estimate.Coef{}) {
						fs = append(fs, fmt.Sprintf("%s on %s", f, shard.Tier(t)))
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", shard.State(st),
					units.FormatBytes(s.PerRank[st][shard.HBM]), units.FormatBytes(s.PerRank[st][shard.Host]),
					units.FormatBytes(s.PerRank[st][shard.NVMe]), strings.Join(fs, ", "))
			}
			tw.Flush()
		}
	}
	for _, n := range notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w, "\nbinary units (GiB = 2^30 B; GB = 10^9 B); --json gives exact bytes")
}

func okStage(stages []estimate.Stage) *estimate.Stage {
	for i := range stages {
		if stages[i].Err == nil {
			return &stages[i]
		}
	}
	return nil
}

type jsonTiers struct {
	HBM  int64 `json:"hbm"`
	Host int64 `json:"host"`
	NVMe int64 `json:"nvme"`
}

type jsonStage struct {
	Stage              int                  `json:"stage"`
	Error              string               `json:"error,omitempty"`
	DeviceBytes        int64                `json:"device_bytes"`
	DeviceFormula      string               `json:"device_formula"`
	DeviceFormulaBytes float64              `json:"device_formula_bytes"`
	HostBytes          int64                `json:"host_bytes"`
	HostFormula        string               `json:"host_formula"`
	NVMeBytes          int64                `json:"nvme_bytes"`
	NVMeFormula        string               `json:"nvme_formula"`
	HostNodeBytes      int64                `json:"host_bytes_per_node"` // one node's ranks' (all of them with one node)
	NVMeNodeBytes      int64                `json:"nvme_bytes_per_node"`
	PerRank            map[string]jsonTiers `json:"per_rank,omitempty"`
	// FrozenSaved is what the frozen chunks do not keep (gradients and
	// master, m, v): hbm per device, host and nvme all ranks, as the
	// columns above.
	FrozenSaved *jsonTiers `json:"frozen_saved_bytes,omitempty"`
	Notes       []string   `json:"notes,omitempty"`
}

func printEstimateJSON(w io.Writer, name, what string, o estimate.Options, stages []estimate.Stage, act *jsonActivations) error {
	out := struct {
		Model            string      `json:"model,omitempty"`
		Description      string      `json:"description"`
		Params           int64       `json:"params"`
		Chunks           int         `json:"chunks"`
		Devices          int         `json:"devices"`
		Nodes            int         `json:"nodes"`
		DevicesPerNode   int         `json:"devices_per_node"`
		OffloadOptimizer string      `json:"offload_optimizer"`
		OffloadParam     string      `json:"offload_param"`
		ShardAlignElems  int64       `json:"shard_align_elems"`
		HostGradDType    string      `json:"host_grad_dtype"`
		Moments          string      `json:"moments"`
		Master           string      `json:"master"`
		OptimizerBytes   float64     `json:"optimizer_state_bytes_per_param"` // master, m and v of a large shard
		HostBudgetBytes  int64       `json:"host_budget_bytes"`
		FrozenChunks     []int       `json:"frozen_chunks,omitempty"`
		FrozenParams     int64       `json:"frozen_params"`
		Stages           []jsonStage `json:"stages"`
		// Activations is each device's activations and the totals per
		// stage (estimate_act.go); absent without a shape.
		Activations *jsonActivations `json:"activations,omitempty"`
	}{Activations: act, Model: name, Description: what, Chunks: len(o.ChunkParams), Devices: o.Devices, Nodes: o.Devices / o.Local(), DevicesPerNode: o.Local(), OffloadOptimizer: estimate.DeviceName(o.OptimizerTier),
		OffloadParam: estimate.DeviceName(o.ParamTier), ShardAlignElems: o.ShardAlignElems, HostGradDType: o.HostGradDType.String(), HostBudgetBytes: o.HostBudgetBytes,
		Moments: estimate.MomentsName(o.StateDType(shard.AdamM)), Master: estimate.MasterName(o.StateDType(shard.Master)), OptimizerBytes: o.OptimizerBytesPerParam()}
	for i, c := range o.ChunkParams {
		out.Params += c
		if i < len(o.Frozen) && o.Frozen[i] {
			out.FrozenChunks = append(out.FrozenChunks, i)
			out.FrozenParams += c
		}
	}
	for _, s := range stages {
		js := jsonStage{Stage: s.Stage}
		if s.Err != nil {
			js.Error = s.Err.Error()
			out.Stages = append(out.Stages, js)
			continue
		}
		f := s.TierFormula(shard.HBM)
		js.DeviceBytes, js.DeviceFormula, js.DeviceFormulaBytes = s.DeviceBytes(), f.String(), f.Bytes(s.Params, s.TrainableParams, o.Devices)
		if o.Frozen != nil {
			js.FrozenSaved = &jsonTiers{s.FrozenSavedBytes(shard.HBM) / int64(o.Devices), s.FrozenSavedBytes(shard.Host), s.FrozenSavedBytes(shard.NVMe)}
		}
		js.HostBytes, js.HostFormula = s.HostBytes(), machine(s.TierFormula(shard.Host), o.Devices).String()
		js.NVMeBytes, js.NVMeFormula = s.NVMeBytes(), machine(s.TierFormula(shard.NVMe), o.Devices).String()
		js.HostNodeBytes, js.NVMeNodeBytes = s.NodeHostBytes(), s.NodeNVMeBytes()
		js.PerRank = map[string]jsonTiers{}
		for st := range shard.StateCount {
			if shard.State(st) == shard.Activation {
				continue
			}
			p := s.PerRank[st]
			js.PerRank[shard.State(st).String()] = jsonTiers{p[shard.HBM], p[shard.Host], p[shard.NVMe]}
		}
		js.Notes = s.Notes
		out.Stages = append(out.Stages, js)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
