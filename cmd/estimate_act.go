package cmd

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
)

// The activation part of `strata estimate`: each device's activations per
// micro-batch kept three ways (no checkpointing, checkpointing,
// cpu_checkpointing), the working set, and per stage the total against a
// device budget.

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

// actTermOrder is the order the terms are printed in: the model's
// allocations as it plans them, then the tier store's room.
var actTermOrder = []string{model.TermTokens, model.TermResidual, model.TermOffloadRing, model.TermBlocks, model.TermWorkSet,
	model.TermHead, model.TermLossChunk, model.TermBackwardTemp, model.TermLoRA, estimate.RestoredInputTerm}

// actConfig is one way of keeping the activations.
type actConfig struct {
	Name string
	Est  estimate.ActivationMemory
}

// actEstimate is the activation part of an estimate.
type actEstimate struct {
	Shape             model.Shape
	Micro, Seq, Accum int
	BudgetBytes       int64 // 0: none given
	Configs           []actConfig
}

// newActEstimate reads the flags (over cfg's values when there is a
// config) and estimates the three ways for shape.
func newActEstimate(c *cli.Context, cfg *config.Config, shape model.Shape, lora *model.LoRA) (*actEstimate, error) {
	a := &actEstimate{Shape: shape, Micro: c.Int("batch"), Seq: c.Int("seq"), Accum: c.Int("accum")}
	dt, checkpoints := c.String("activation-dtype"), c.Int("checkpoints")
	if cfg != nil {
		if !c.IsSet("batch") {
			a.Micro = cfg.TrainMicroBatchSizePerGPU
		}
		if !c.IsSet("seq") {
			a.Seq = cfg.Strata.SeqLen
		}
		if !c.IsSet("accum") {
			a.Accum = cfg.GradientAccumulationSteps
		}
		if !c.IsSet("hbm") {
			a.BudgetBytes = cfg.Strata.HBMBytes
		}
		if !c.IsSet("activation-dtype") {
			dt = cfg.Strata.ActivationDType
		}
		if ac := cfg.ActivationCheckpointing; ac != nil && !c.IsSet("checkpoints") {
			checkpoints = ac.NumberCheckpoints
		}
	}
	if a.Seq == 0 {
		a.Seq = shape.MaxSeq
	}
	if c.IsSet("hbm") {
		b, err := units.ParseBytes(c.String("hbm"))
		if err != nil || b < 1 {
			return nil, usagef("estimate: --hbm %q is not a byte size such as 80GiB", c.String("hbm"))
		}
		a.BudgetBytes = b
	}
	switch {
	case a.Micro < 1 || a.Accum < 1:
		return nil, usagef("estimate: --batch %d and --accum %d must be at least 1", a.Micro, a.Accum)
	case a.Seq < 1 || a.Seq > shape.MaxSeq:
		return nil, usagef("estimate: --seq %d: want 1 to the model's max_seq_len %d", a.Seq, shape.MaxSeq)
	case checkpoints < 0 || checkpoints > shape.Layers:
		return nil, usagef("estimate: --checkpoints %d: want 1 to the model's %d blocks (0: every block)", checkpoints, shape.Layers)
	case dt != config.ActivationBF16 && dt != config.ActivationFP32:
		return nil, usagef("estimate: --activation-dtype %q is not bf16 or fp32", dt)
	}
	if err := estimate.CheckActivationTokens(shape, a.Micro, a.Seq); err != nil {
		batch, seq := "--batch", "--seq"
		if !c.IsSet("batch") && cfg != nil {
			batch = "train_micro_batch_size_per_gpu"
		}
		if !c.IsSet("seq") && cfg != nil && cfg.Strata.SeqLen != 0 {
			seq = "strata.seq_len"
		}
		return nil, usagef("estimate: %s %d × %s %d tokens a micro-batch: the activation sizes pass 2^63 bytes (8 EiB) and would wrap; use a smaller %s", batch, a.Micro, seq, a.Seq, batch)
	}
	if checkpoints == 0 {
		checkpoints = shape.Layers
	}
	o := model.ActivationOptions{DType: gpu.BF16, LoRA: lora}
	if dt == config.ActivationFP32 {
		o.DType = gpu.F32
	}
	for _, k := range []struct {
		name    string
		ckpt    int
		offload bool
	}{{"none", 0, false}, {"checkpointing", checkpoints, false}, {"cpu_checkpointing", checkpoints, true}} {
		ko := o
		ko.Checkpoint, ko.Offload = k.ckpt, k.offload
		a.Configs = append(a.Configs, actConfig{Name: k.name, Est: estimate.Activations(shape, a.Micro, a.Seq, ko)})
	}
	return a, nil
}

// stageTotal is one stage's device memory with each way of keeping the
// activations: model state + working set + activations.
type stageTotal struct {
	Stage      int
	ModelState int64
	Working    estimate.WorkingSet
	Totals     []int64 // per actEstimate.Configs
}

func (a *actEstimate) totals(stages []estimate.Stage) []stageTotal {
	var out []stageTotal
	for _, s := range stages {
		if s.Err != nil {
			continue
		}
		st := stageTotal{Stage: s.Stage, ModelState: s.DeviceBytes(), Working: estimate.WorkingSetOf(s.ModelState, a.Accum)}
		for _, k := range a.Configs {
			st.Totals = append(st.Totals, st.ModelState+st.Working.Bytes()+k.Est.DeviceBytes())
		}
		out = append(out, st)
	}
	return out
}

// fit is the first configuration, by stage and then by way of keeping the
// activations (none, checkpointing, cpu_checkpointing: in order of the
// compute and traffic they add), whose total is within the budget; ok is
// false when none is, and then the smallest total is given.
func (a *actEstimate) fit(totals []stageTotal) (stage, config int, total int64, ok bool) {
	best := int64(-1)
	for _, st := range totals {
		for k, t := range st.Totals {
			if t <= a.BudgetBytes {
				return st.Stage, k, t, true
			}
			if best < 0 || t < best {
				best, stage, config = t, st.Stage, k
			}
		}
	}
	return stage, config, best, false
}

func bytesCell(n int64) string {
	if n == 0 {
		return "-"
	}
	s := units.FormatBytes(n)
	if n >= 100e6 {
		s += fmt.Sprintf(" (%.1f GB)", float64(n)/1e9)
	}
	return s
}

func (a *actEstimate) print(w io.Writer, stages []estimate.Stage) {
	dt := a.Configs[0].Est.Options.DType
	fmt.Fprintf(w, "\nactivations per device, micro-batch %d × %d tokens, %s activations (fp32 norm and softmax statistics, loss chunk and residual gradient):\n",
		a.Micro, a.Seq, strings.ToLower(dt.String()))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "term"
	for _, k := range a.Configs {
		head += "\t" + k.Name
	}
	fmt.Fprintln(tw, head)
	for _, n := range actTermOrder {
		row := n
		for _, k := range a.Configs {
			var b int64
			for _, t := range k.Est.AllTerms() {
				if t.Name == n {
					b = t.Bytes
				}
			}
			row += "\t" + bytesCell(b)
		}
		fmt.Fprintln(tw, row)
	}
	row, host := "activations per device", "saved block inputs in host memory, per device"
	for _, k := range a.Configs {
		row += "\t" + bytesCell(k.Est.DeviceBytes())
		host += "\t" + bytesCell(k.Est.HostInputBytes)
	}
	fmt.Fprintln(tw, row)
	fmt.Fprintln(tw, host)
	tw.Flush()
	ck := a.Configs[1].Est.Options.Checkpoint
	fmt.Fprintf(w, "checkpointing: %d of %d blocks recomputed in the backward from their saved input; cpu_checkpointing keeps those inputs in pinned host memory (the tier store brings each back ahead of its block's backward)\n", ck, a.Shape.Layers)

	totals := a.totals(stages)
	if len(totals) == 0 {
		return
	}
	fmt.Fprintln(w, "\nper device: model state + working set + activations")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head = "stage\tmodel state\tworking set"
	for _, k := range a.Configs {
		head += "\t" + k.Name
	}
	fmt.Fprintln(tw, head)
	for _, st := range totals {
		row := fmt.Sprintf("%d\t%s\t%s", st.Stage, bytesCell(st.ModelState), bytesCell(st.Working.Bytes()))
		for _, t := range st.Totals {
			cell := bytesCell(t)
			if a.BudgetBytes > 0 {
				if t <= a.BudgetBytes {
					cell += " fits"
				} else {
					cell += " over"
				}
			}
			row += "\t" + cell
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
	for _, st := range totals {
		var parts []string
		for _, t := range st.Working.Terms() {
			parts = append(parts, fmt.Sprintf("%s %s", t.Name, units.FormatBytes(t.Bytes)))
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "working set, stage %d: %s\n", st.Stage, strings.Join(parts, ", "))
		}
	}
	if a.BudgetBytes == 0 {
		fmt.Fprintln(w, "give --hbm (the device budget) to see which configuration fits")
		return
	}
	stage, k, total, ok := a.fit(totals)
	if ok {
		fmt.Fprintf(w, "fits in %s per device: stage %d with %s (%s) (the table marks every configuration that fits)\n",
			units.FormatBytes(a.BudgetBytes), stage, a.configPhrase(k), units.FormatBytes(total))
		return
	}
	fmt.Fprintf(w, "nothing fits in %s per device: the least is stage %d with %s (%s); use more devices (--devices), offload (--offload-optimizer, --offload-param), or a smaller --batch or --seq\n",
		units.FormatBytes(a.BudgetBytes), stage, a.configPhrase(k), units.FormatBytes(total))
}

// configPhrase names configuration k in a sentence.
func (a *actEstimate) configPhrase(k int) string {
	switch a.Configs[k].Name {
	case "none":
		return "no activation checkpointing"
	case "checkpointing":
		return "activation checkpointing"
	}
	return "activation checkpointing and cpu_checkpointing"
}

// jsonActivations is the activation part of `strata estimate --json`.
type jsonActivations struct {
	Micro       int                      `json:"micro_batch"`
	Seq         int                      `json:"seq"`
	DType       string                   `json:"dtype"`
	Checkpoints int                      `json:"number_checkpoints"`
	BudgetBytes int64                    `json:"hbm_budget_bytes,omitempty"`
	Configs     []jsonActConfig          `json:"configs"`
	Stages      []jsonActStage           `json:"stages"`
	Fit         *jsonActFit              `json:"fit,omitempty"`
	WorkingSet  map[int]map[string]int64 `json:"working_set_bytes"`
}

type jsonActConfig struct {
	Name        string           `json:"name"`
	DeviceBytes int64            `json:"device_bytes"`
	HostBytes   int64            `json:"host_bytes"`
	Terms       map[string]int64 `json:"terms"`
}

type jsonActStage struct {
	Stage           int              `json:"stage"`
	ModelStateBytes int64            `json:"model_state_bytes"`
	WorkingSetBytes int64            `json:"working_set_bytes"`
	TotalBytes      map[string]int64 `json:"total_bytes"`
}

type jsonActFit struct {
	Fits   bool   `json:"fits"`
	Stage  int    `json:"stage"`
	Config string `json:"config"`
	Bytes  int64  `json:"bytes"`
}

func (a *actEstimate) json(stages []estimate.Stage) *jsonActivations {
	j := &jsonActivations{Micro: a.Micro, Seq: a.Seq, DType: strings.ToLower(a.Configs[0].Est.Options.DType.String()),
		Checkpoints: a.Configs[1].Est.Options.Checkpoint, BudgetBytes: a.BudgetBytes, WorkingSet: map[int]map[string]int64{}}
	for _, k := range a.Configs {
		jc := jsonActConfig{Name: k.Name, DeviceBytes: k.Est.DeviceBytes(), HostBytes: k.Est.HostInputBytes, Terms: map[string]int64{}}
		for _, t := range k.Est.AllTerms() {
			jc.Terms[t.Name] = t.Bytes
		}
		j.Configs = append(j.Configs, jc)
	}
	totals := a.totals(stages)
	for _, st := range totals {
		js := jsonActStage{Stage: st.Stage, ModelStateBytes: st.ModelState, WorkingSetBytes: st.Working.Bytes(), TotalBytes: map[string]int64{}}
		for k, t := range st.Totals {
			js.TotalBytes[a.Configs[k].Name] = t
		}
		j.Stages = append(j.Stages, js)
		ws := map[string]int64{}
		for _, t := range st.Working.Terms() {
			ws[t.Name] = t.Bytes
		}
		j.WorkingSet[st.Stage] = ws
	}
	if a.BudgetBytes > 0 && len(totals) > 0 {
		stage, k, total, ok := a.fit(totals)
		j.Fit = &jsonActFit{Fits: ok, Stage: stage, Config: a.Configs[k].Name, Bytes: total}
	}
	return j
}
