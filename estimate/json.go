package estimate

import (
	"strings"

	"github.com/strata-ai/strata/shard"
)

// The JSON `strata estimate --json` writes: a Report as tagged structs.

// JSONReport is a Report as `strata estimate --json` writes it (exact
// bytes; Report.JSON).
type JSONReport struct {
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
	Stages           []JSONStage `json:"stages"`
	// Activations is each device's activations and the totals per
	// stage; absent without a shape.
	Activations *JSONActivations `json:"activations,omitempty"`
}

// JSONTiers is bytes on each tier.
type JSONTiers struct {
	HBM  int64 `json:"hbm"`
	Host int64 `json:"host"`
	NVMe int64 `json:"nvme"`
}

// JSONStage is one stage's model state: per device, all ranks' host and
// NVMe, each beside its formula, and one rank's by state.
type JSONStage struct {
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
	PerRank            map[string]JSONTiers `json:"per_rank,omitempty"`
	// FrozenSaved is what the frozen chunks do not keep (gradients and
	// master, m, v): hbm per device, host and nvme all ranks, as the
	// columns above.
	FrozenSaved *JSONTiers `json:"frozen_saved_bytes,omitempty"`
	Notes       []string   `json:"notes,omitempty"`
}

// JSONActivations is the activation part of a JSONReport.
type JSONActivations struct {
	Micro       int                      `json:"micro_batch"`
	Seq         int                      `json:"seq"`
	DType       string                   `json:"dtype"`
	Checkpoints int                      `json:"number_checkpoints"`
	BudgetBytes int64                    `json:"hbm_budget_bytes,omitempty"`
	Configs     []JSONActConfig          `json:"configs"`
	Stages      []JSONActStage           `json:"stages"`
	Fit         *JSONActFit              `json:"fit,omitempty"`
	WorkingSet  map[int]map[string]int64 `json:"working_set_bytes"`
}

// JSONActConfig is one way of keeping the activations: its bytes per
// device, in host memory, and by term.
type JSONActConfig struct {
	Name        string           `json:"name"`
	DeviceBytes int64            `json:"device_bytes"`
	HostBytes   int64            `json:"host_bytes"`
	Terms       map[string]int64 `json:"terms"`
}

// JSONActStage is one stage's total per device with each way of keeping
// the activations.
type JSONActStage struct {
	Stage           int              `json:"stage"`
	ModelStateBytes int64            `json:"model_state_bytes"`
	WorkingSetBytes int64            `json:"working_set_bytes"`
	TotalBytes      map[string]int64 `json:"total_bytes"`
}

// JSONActFit is ActivationReport.Fit.
type JSONActFit struct {
	Fits   bool   `json:"fits"`
	Stage  int    `json:"stage"`
	Config string `json:"config"`
	Bytes  int64  `json:"bytes"`
}

// JSON is r as tagged structs (`strata estimate --json`).
func (r *Report) JSON() JSONReport {
	o := r.Options
	out := JSONReport{Model: r.Model, Description: r.Description, Chunks: len(o.ChunkParams), Devices: o.Devices, Nodes: o.Devices / o.Local(), DevicesPerNode: o.Local(), OffloadOptimizer: DeviceName(o.OptimizerTier),
		OffloadParam: DeviceName(o.ParamTier), ShardAlignElems: o.ShardAlignElems, HostGradDType: o.HostGradDType.String(), HostBudgetBytes: o.HostBudgetBytes,
		Moments: MomentsName(o.StateDType(shard.AdamM)), Master: MasterName(o.StateDType(shard.Master)), OptimizerBytes: o.OptimizerBytesPerParam()}
	if r.Activations != nil {
		out.Activations = r.Activations.json()
	}
	for i, c := range o.ChunkParams {
		out.Params += c
		if i < len(o.Frozen) && o.Frozen[i] {
			out.FrozenChunks = append(out.FrozenChunks, i)
			out.FrozenParams += c
		}
	}
	for _, s := range r.Stages {
		out.Stages = append(out.Stages, jsonStage(o, s))
	}
	return out
}

func jsonStage(o Options, s Stage) JSONStage {
	js := JSONStage{Stage: s.Stage}
	if s.Err != nil {
		js.Error = s.Err.Error()
		return js
	}
	f := s.TierFormula(shard.HBM)
	js.DeviceBytes, js.DeviceFormula, js.DeviceFormulaBytes = s.DeviceBytes(), f.String(), f.Bytes(s.Params, s.TrainableParams, o.Devices)
	if o.Frozen != nil {
		js.FrozenSaved = &JSONTiers{s.FrozenSavedBytes(shard.HBM) / int64(o.Devices), s.FrozenSavedBytes(shard.Host), s.FrozenSavedBytes(shard.NVMe)}
	}
	js.HostBytes, js.HostFormula = s.HostBytes(), machineCoef(s.TierFormula(shard.Host), o.Devices).String()
	js.NVMeBytes, js.NVMeFormula = s.NVMeBytes(), machineCoef(s.TierFormula(shard.NVMe), o.Devices).String()
	js.HostNodeBytes, js.NVMeNodeBytes = s.NodeHostBytes(), s.NodeNVMeBytes()
	js.PerRank = map[string]JSONTiers{}
	for st := range shard.StateCount {
		if shard.State(st) == shard.Activation {
			continue
		}
		p := s.PerRank[st]
		js.PerRank[shard.State(st).String()] = JSONTiers{p[shard.HBM], p[shard.Host], p[shard.NVMe]}
	}
	js.Notes = s.Notes
	return js
}

func (a *ActivationReport) json() *JSONActivations {
	j := &JSONActivations{Micro: a.Micro, Seq: a.Seq, DType: strings.ToLower(a.Configs[0].Est.Options.DType.String()),
		Checkpoints: a.Configs[1].Est.Options.Checkpoint, BudgetBytes: a.BudgetBytes, WorkingSet: map[int]map[string]int64{}}
	for _, k := range a.Configs {
		jc := JSONActConfig{Name: k.Name, DeviceBytes: k.Est.DeviceBytes(), HostBytes: k.Est.HostInputBytes, Terms: map[string]int64{}}
		for _, t := range k.Est.AllTerms() {
			jc.Terms[t.Name] = t.Bytes
		}
		j.Configs = append(j.Configs, jc)
	}
	for _, st := range a.Totals {
		js := JSONActStage{Stage: st.Stage, ModelStateBytes: st.ModelState, WorkingSetBytes: st.Working.Bytes(), TotalBytes: map[string]int64{}}
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
	if a.BudgetBytes > 0 && len(a.Totals) > 0 {
		stage, k, total, ok := a.Fit()
		j.Fit = &JSONActFit{Fits: ok, Stage: stage, Config: a.Configs[k].Name, Bytes: total}
	}
	return j
}
