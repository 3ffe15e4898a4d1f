package plan

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/model"
)

// Job is what a run trains: the whole model (a full fine-tune), or LoRA
// adapters on a frozen base that is stored as bf16 or, with the params
// offloaded, coded (QLoRA: nf4; int8). Every placement of Configs is
// listed for the job; a coded base's need the params offloaded (the base
// streams from host RAM or NVMe and is decoded on the devices).
type Job struct {
	// LoRA is nil for a full fine-tune.
	LoRA *JobLoRA `json:"lora,omitempty"`
}

// JobLoRA is a LoRA job: strata.lora's rank, alpha, targets and the
// base's stored format.
type JobLoRA struct {
	R         int      `json:"r"`
	Alpha     float64  `json:"alpha"`
	Targets   []string `json:"target_modules"`
	BaseDType string   `json:"base_dtype"` // config.BaseDTypes
}

// Full is the job of a full fine-tune.
var Full = Job{}

// Name is the job in words: "full", "LoRA r 16 on all-linear",
// "QLoRA (nf4 base) r 16 on q_proj, v_proj".
func (j Job) Name() string {
	if j.LoRA == nil {
		return "full"
	}
	l := j.LoRA
	kind := "LoRA"
	if l.BaseDType != config.BaseBF16 {
		kind = fmt.Sprintf("QLoRA (%s base)", l.BaseDType)
	}
	return fmt.Sprintf("%s r %d on %s", kind, l.R, strings.Join(l.Targets, ", "))
}

// computeKey is what the profile's measured step of the job is kept
// under: the adapters' shape decides the devices' work; the base's
// stored format does not (the step is measured with a bf16 base on the
// devices, the decoding added per placement: Profile.Decodes).
func (j Job) computeKey() string {
	if j.LoRA == nil {
		return ""
	}
	return fmt.Sprintf("lora r=%d targets=%s", j.LoRA.R, strings.Join(j.LoRA.Targets, ","))
}

// coded is the base's stored format when it is not bf16 ("" otherwise).
func (j Job) coded() string {
	if j.LoRA == nil || j.LoRA.BaseDType == config.BaseBF16 {
		return ""
	}
	return j.LoRA.BaseDType
}

// ParseJob reads `strata plan`'s --job (full, lora, qlora), --lora
// ("r=16,alpha=32,targets=q_proj+v_proj" or "targets=all-linear") and
// --base-dtype (bf16, nf4, int8; qlora's default nf4) for a model of
// shape s; the targets default as strata.lora's do for the model.
func ParseJob(kind, lora, baseDType string, s model.Shape) (Job, error) {
	switch kind {
	case "", "full":
		if lora != "" || baseDType != "" {
			return Job{}, fmt.Errorf("plan: --lora and --base-dtype describe a LoRA job: give --job lora or qlora")
		}
		return Full, nil
	case "lora", "qlora":
	default:
		return Job{}, fmt.Errorf("plan: --job %q: full, lora or qlora", kind)
	}
	l := &JobLoRA{R: 16, BaseDType: baseDType}
	if l.BaseDType == "" {
		l.BaseDType = config.BaseBF16
		if kind == "qlora" {
			l.BaseDType = config.BaseNF4
		}
	}
	if !slices.Contains(config.BaseDTypes, l.BaseDType) {
		return Job{}, fmt.Errorf("plan: --base-dtype %q: one of %s", l.BaseDType, strings.Join(config.BaseDTypes, ", "))
	}
	if kind == "qlora" && l.BaseDType == config.BaseBF16 {
		return Job{}, fmt.Errorf("plan: --job qlora with a bf16 base is --job lora")
	}
	for kv := range strings.SplitSeq(lora, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("not key=value")
		case k == "r":
			l.R, err = strconv.Atoi(v)
			if err == nil && l.R < 1 {
				err = fmt.Errorf("the rank is at least 1")
			}
		case k == "alpha":
			l.Alpha, err = strconv.ParseFloat(v, 64)
		case k == "targets":
			l.Targets = strings.Split(v, "+")
		default:
			err = fmt.Errorf("unknown key (r, alpha, targets)")
		}
		if err != nil {
			return Job{}, fmt.Errorf("plan: --lora %q: %s: %v", lora, kv, err)
		}
	}
	if l.Alpha == 0 {
		l.Alpha = float64(2 * l.R)
	}
	if len(l.Targets) == 0 {
		cfg := config.Config{Strata: config.Strata{LoRA: &config.LoRA{R: l.R}}}
		l.Targets = estimate.LoRAFromConfig(&cfg, s).Targets
	}
	j := Job{LoRA: l}
	if err := j.modelLoRA().Validate(s); err != nil {
		return Job{}, fmt.Errorf("plan: --lora: %w", err)
	}
	return j, nil
}

// Flags are the job as strata plan's flags (ParseJob reads them back):
// "" for a full fine-tune, else " --job lora --lora r=16,alpha=32,targets=q_proj+v_proj"
// and the base's --base-dtype when it is not bf16.
func (j Job) Flags() string {
	if j.LoRA == nil {
		return ""
	}
	l := j.LoRA
	f := fmt.Sprintf(" --job lora --lora r=%d,alpha=%g,targets=%s", l.R, l.Alpha, strings.Join(l.Targets, "+"))
	if l.BaseDType != config.BaseBF16 {
		f += " --base-dtype " + l.BaseDType
	}
	return f
}

// JobFromConfig is the job of a resolved config: strata.lora's, or full.
func JobFromConfig(cfg *config.Config, s model.Shape) Job {
	l := estimate.LoRAFromConfig(cfg, s)
	if l == nil {
		return Full
	}
	base := cfg.Strata.LoRA.BaseDType
	if base == "" {
		base = config.BaseBF16
	}
	return Job{LoRA: &JobLoRA{R: l.R, Alpha: l.Alpha, Targets: l.Targets, BaseDType: base}}
}

// modelLoRA is the job's adapters as package model takes them (nil: full).
func (j Job) modelLoRA() *model.LoRA {
	if j.LoRA == nil {
		return nil
	}
	return &model.LoRA{R: j.LoRA.R, Alpha: j.LoRA.Alpha, Targets: slices.Clone(j.LoRA.Targets), Base: estimate.BaseDType(j.LoRA.BaseDType)}
}

// configJSON is the job's strata.lora block ("" for a full fine-tune),
// as a line of the config's "strata" object.
func (j Job) configJSON() string {
	if j.LoRA == nil {
		return ""
	}
	l := j.LoRA
	t, _ := json.Marshal(l.Targets) // strings: no error
	return fmt.Sprintf(`, "lora": {"r": %d, "alpha": %g, "target_modules": %s, "base_dtype": %q}`, l.R, l.Alpha, t, l.BaseDType)
}
