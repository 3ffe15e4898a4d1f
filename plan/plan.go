// Package plan ranks the placements of a run by their predicted step time.
//
// It predicts, for one model, batch and machine, the memory per
// tier and the step time of every placement Strata can train it in, from
// a machine profile (profile.go: what `strata plan --probe` measured) and
// the memory arithmetic of package estimate; it ranks the placements that
// fit, fastest first, and names each one's bottleneck. The predictor
// (Fit, Predict) measures nothing and runs no engine; the probes
// (probe.go: ProbeRates, ProbeDisk, ProbeCompute) measure the profile's
// rates on this machine with the components a run uses, and Run is what
// `strata plan` does: the machine's budgets, the profile (the missing
// parts measured and saved), the predictions and the optional check.
//
// # The time model
//
// A step is built from terms, each bytes or work over a measured rate,
// for the job (Job: a full fine-tune, or LoRA adapters on a frozen base,
// bf16 or coded) and its micro-batches (Inputs.Accum):
//
//   - compute: the forward and backward of the job at this batch and
//     sequence on these devices, measured (Profile.Computes: a resident
//     step without its optimizer phase), per micro-batch;
//   - adam: the optimizer on the devices as measured beside it, or on the
//     host Ψₜ / cpuadam's params/s for the placement's optimizer state
//     (Profile.AdamStates), Ψₜ the trainable params (the model, or the
//     adapters);
//   - copy: the bytes between host and devices: the reduced gradient down
//     and the new params up (2 + 2 bytes a trainable param,
//     offload_optimizer), and with offload_param, when the params do not
//     fit the devices' spare memory (where the tier store keeps them
//     staged), the params up for each forward and backward as stored (a
//     coded frozen base in its code);
//   - staging: with the optimizer state off the devices, what the host
//     path costs beyond CPU Adam and the copies, calibrated from a
//     measured ZeRO-Offload step of the job (Compute.OffloadStepSeconds);
//   - decode: a coded base brought up, decoded on the devices
//     (Profile.Decodes);
//   - disk: with the optimizer state on NVMe, master, m and v read and
//     written every step (estimate's bytes a trainable param), with the
//     params on NVMe the new params' write and, unless staged on the
//     devices, their reads per pass, over the path's probed rates (the
//     larger of the reads at the read rate, the writes at the write rate
//     and both at the rate of both at once) divided by the share of them
//     the engine's moves got in a measured step (Compute.NVMeEfficiency).
//
// The step is two phases (overlap exact, the update after the clipped
// backward): the forward, with the update's disk work beside it, then
// the backward; each the slowest of its devices' work and its disk work.
// On the CPU backend the devices are the host's cores, shared with the
// host optimizer, so CPU Adam and the staging add to the forward's
// devices' work; on a GPU the host optimizer runs beside the devices
// (not yet checked against a GPU).
package plan

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// Config is one placement: the ZeRO stage, where the optimizer state and
// the params live, the offloaded optimizer state's precision
// (strata.optimizer_state: "fp32" both, or Narrow's), and whether every
// block's activations are recomputed in the backward
// (activation_checkpointing).
type Config struct {
	Name       string     `json:"name"`
	Stage      int        `json:"stage"`
	Optimizer  shard.Tier `json:"-"`
	Params     shard.Tier `json:"-"`
	Moments    string     `json:"moments"`
	Master     string     `json:"master"`
	Checkpoint bool       `json:"activation_checkpointing"`
}

// The narrow optimizer state the placements at stage 3 with the optimizer
// offloaded are listed with too: the fewest bytes per parameter Strata
// keeps (int8 moments, the master as the bf16 param plus a remainder).
// The names are config's (strata.optimizer_state), as estimate parses
// them.
const (
	NarrowMoments = "int8"
	NarrowMaster  = "bf16+remainder"
	narrowName    = ", int8 moments, bf16+remainder master"
	fp32State     = "fp32"
)

// Narrow says whether c keeps the narrow optimizer state.
func (c Config) Narrow() bool { return c.Moments == NarrowMoments }

// Configs are the placements of one device count, device-resident first,
// then the host (ZeRO-Offload, then the params too), then NVMe (the
// optimizer state, then the params too) when nvme is true; each offloaded
// one at stage 3 again with the narrow optimizer state; then every one of
// them again with activation checkpointing (every block). A LoRA job's
// optimizer state is its adapters' (a small fraction of the base), so its
// placements are not listed again with the narrow state; a coded base
// (QLoRA) needs the params offloaded, so its resident and
// optimizer-only placements are not listed.
func Configs(devices int, nvme bool, job Job) []Config {
	var out []Config
	add := func(name string, stage int, opt, params shard.Tier) {
		out = append(out, Config{Name: name, Stage: stage, Optimizer: opt, Params: params, Moments: fp32State, Master: fp32State})
	}
	for s := 0; s <= 3; s++ {
		add(fmt.Sprintf("stage %d, resident", s), s, shard.HBM, shard.HBM)
	}
	for s := 1; s <= 3; s++ {
		add(fmt.Sprintf("stage %d, optimizer on host", s), s, shard.Host, shard.HBM)
	}
	add("stage 3, params and optimizer on host", 3, shard.Host, shard.Host)
	if nvme {
		add("stage 3, optimizer on NVMe, params on host", 3, shard.NVMe, shard.Host)
		add("stage 3, params and optimizer on NVMe", 3, shard.NVMe, shard.NVMe)
	}
	if job.coded() != "" {
		out = slices.DeleteFunc(out, func(c Config) bool { return c.Params == shard.HBM })
	}
	for _, c := range slices.Clone(out) {
		if job.LoRA == nil && c.Stage == 3 && c.Optimizer != shard.HBM {
			c.Name, c.Moments, c.Master = c.Name+narrowName, NarrowMoments, NarrowMaster
			out = append(out, c)
		}
	}
	for _, c := range slices.Clone(out) {
		c.Name, c.Checkpoint = c.Name+checkpointName, true
		out = append(out, c)
	}
	return out
}

const checkpointName = ", activation checkpointing"

// Inputs are one question: a model, its batch, the devices and their
// budgets.
type Inputs struct {
	Model   string // as the profile's Compute names it
	Shape   model.Shape
	Job     Job // a full fine-tune, or LoRA adapters on the frozen base
	Devices int
	Batch   int // rows per device per micro-batch
	Accum   int // micro-batches a step (gradient_accumulation_steps; 0 is 1)
	Seq     int
	// HBMBytes is each device's memory; HostBytes the host RAM a run may
	// use (MemAvailable); NVMePath and NVMeFreeBytes the NVMe path and its
	// free space ("" and 0: no NVMe placements).
	HBMBytes      int64
	HostBytes     int64
	NVMePath      string
	NVMeFreeBytes int64
	// SharedCores: the devices compute on the host's cores (the CPU
	// backend), so the host optimizer cannot hide under them.
	SharedCores bool
}

// Prediction is one placement's memory and predicted step.
type Prediction struct {
	Config
	Fits bool `json:"fits"`
	// Short says what does not fit and by how much ("" when it fits).
	Short       string  `json:"short,omitempty"`
	DeviceBytes int64   `json:"device_bytes"` // per device: model state, activations, working set
	HostBytes   int64   `json:"host_bytes"`   // all ranks: the pinned pool (pinnedHostBytes), or the homes without a tier store
	NVMeBytes   int64   `json:"nvme_bytes"`
	StepSeconds float64 `json:"predicted_step_s"`
	// Rank numbers the fitting placements by predicted step, placements
	// within TieFraction of their rank's fastest sharing it (Predict sets
	// it; 0 for one that does not fit).
	Rank int `json:"rank,omitempty"`
	// Terms are the step's parts in seconds: compute, adam, copy, disk.
	Terms      map[string]float64 `json:"terms_s"`
	Bottleneck string             `json:"bottleneck"`
	// OptimizerPlace and ParamsPlace are the config's words for the tiers.
	OptimizerPlace string `json:"optimizer"`
	ParamsPlace    string `json:"params"`
	// stagingBytes is the host room, all ranks, the tier store has for
	// shards staged through the host beyond their homes
	// (estimate.HostStagingBytes): where the update's writes wait for the
	// drive while the backward computes.
	stagingBytes int64
}

// Fit returns every placement (Configs' order) with its memory per tier
// and whether it fits in's budgets; no step time (no profile needed).
func Fit(in Inputs) ([]Prediction, error) {
	return fit(in, Configs(in.Devices, in.NVMePath != "", in.Job))
}

// fit is Fit of the placements cfgs.
func fit(in Inputs, cfgs []Config) ([]Prediction, error) {
	l, err := model.NewLayout(in.Shape)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if lo := in.Job.modelLoRA(); lo != nil {
		if l, err = l.WithLoRA(*lo); err != nil {
			return nil, fmt.Errorf("plan: LoRA: %w", err)
		}
	}
	var out []Prediction
	for _, cf := range cfgs {
		pr := Prediction{Config: cf, Terms: map[string]float64{}, OptimizerPlace: estimate.DeviceName(cf.Optimizer), ParamsPlace: estimate.DeviceName(cf.Params)}
		if err := memory(&pr, l, in); err != nil {
			return nil, err
		}
		out = append(out, pr)
	}
	return out, nil
}

// ErrNoMeasurement is a profile without a figure a prediction needs
// (*MeasurementError matches it): strata plan measures it.
var ErrNoMeasurement = errors.New("plan: the profile lacks a measurement")

// MeasurementError is Predict's refusal of a profile that lacks a figure
// the prediction of Inputs needs: the model's step at its devices, batch
// and sequence, the NVMe path's rates, or the copy and CPU Adam rates.
// strata plan with the same inputs measures what it lacks.
type MeasurementError struct {
	Inputs Inputs
	// Lacks is what the profile lacks, as a predicate of "the profile"
	// ("has no step of gpt2 on 1 device(s) at batch 4 × 128 tokens").
	Lacks string
}

// Error names what the profile lacks and the way to measure it.
func (e *MeasurementError) Error() string {
	return "plan: the profile " + e.Lacks + ": measure it (--probe)"
}

// Is matches ErrNoMeasurement.
func (e *MeasurementError) Is(target error) bool { return target == ErrNoMeasurement }

// Predict returns every placement's prediction, those that fit fastest
// first, then those that do not (in Configs' order); the checkpointed ones
// only when the profile holds the checkpointed step. The profile must
// hold the model's compute for the job at these devices, batch and
// sequence (Profile.Compute), the NVMe path's rates when one is given,
// and the decoding of a coded base: a profile without them is a
// *MeasurementError (ErrNoMeasurement).
func Predict(p *Profile, in Inputs) ([]Prediction, error) {
	return predict(p, in, Configs(in.Devices, in.NVMePath != "", in.Job))
}

// predict is Predict of the placements cfgs.
func predict(p *Profile, in Inputs, cfgs []Config) ([]Prediction, error) {
	c, ok := p.Compute(in.Model, in.Job, in.Devices, in.Batch, in.Seq)
	if !ok {
		job := ""
		if in.Job.LoRA != nil {
			job = " (" + in.Job.Name() + ")"
		}
		return nil, &MeasurementError{Inputs: in, Lacks: fmt.Sprintf("has no step of %s%s on %d device(s) at batch %d × %d tokens", in.Model, job, in.Devices, in.Batch, in.Seq)}
	}
	var disk Disk
	if in.NVMePath != "" {
		if disk, ok = p.Disk(in.NVMePath); !ok {
			return nil, &MeasurementError{Inputs: in, Lacks: "has no rates for the NVMe path " + in.NVMePath}
		}
	}
	if p.CopyBytesPerS <= 0 || p.AdamParamsPerS <= 0 || p.AdamRate(NarrowMoments, NarrowMaster) <= 0 {
		return nil, &MeasurementError{Inputs: in, Lacks: "lacks the copy or CPU Adam rates (fp32, and int8 moments with a bf16+remainder master)"}
	}
	if f := in.Job.coded(); f != "" && p.DecodeRate(f) <= 0 {
		return nil, &MeasurementError{Inputs: in, Lacks: "lacks the devices' " + f + " decoding"}
	}
	out, err := fit(in, cfgs)
	if err != nil {
		return nil, err
	}
	if c.CheckpointFwdBwdSeconds == 0 {
		// A profile from before checkpointing was listed (strata plan
		// measures it on first use): the checkpointed placements are left
		// out, the others predicted as before.
		out = slices.DeleteFunc(out, func(pr Prediction) bool { return pr.Checkpoint })
	}
	w, err := workOf(in)
	if err != nil {
		return nil, err
	}
	extra, err := paramsOverhead(p, c, disk, in, w)
	if err != nil {
		return nil, err
	}
	for i := range out {
		predictStep(&out[i], p, c, disk, in, w, extra)
	}
	slices.SortStableFunc(out, func(a, b Prediction) int {
		switch {
		case a.Fits != b.Fits:
			if a.Fits {
				return -1
			}
			return 1
		case a.Fits:
			return cmpFloat(a.StepSeconds, b.StepSeconds)
		}
		return 0
	})
	rank(out)
	return out, nil
}

// work is what one step moves and updates, in parameters: the trainable
// ones (the whole model, or the adapters) and the frozen base, with the
// bytes a frozen param is stored in off the devices.
type work struct {
	trainable, frozen float64
	codedBytes        float64 // bytes a frozen param in host RAM or on NVMe (2: bf16)
	// passShare is the share of the model's params a pass reads: 1 for a
	// dense model; for a mixture of experts the dense ones and the experts
	// the micro-batches of all the devices reach (model.Shape.PassParamCount).
	passShare float64
}

func workOf(in Inputs) (work, error) {
	psi := float64(in.Shape.ParamCount())
	share := in.Shape.PassParamCount(max(in.Batch, 1)*max(in.Seq, 1)*max(in.Devices, 1)) / psi
	lo := in.Job.modelLoRA()
	if lo == nil {
		return work{trainable: psi, passShare: share}, nil
	}
	l, err := model.NewLayout(in.Shape)
	if err == nil {
		l, err = l.WithLoRA(*lo)
	}
	if err != nil {
		return work{}, fmt.Errorf("plan: LoRA: %w", err)
	}
	w := work{trainable: float64(l.ParamCount()) - psi, frozen: psi, codedBytes: 2, passShare: share}
	if f := in.Job.coded(); f != "" {
		w.codedBytes = float64(estimate.BaseDType(f).Bytes(1<<20)) / (1 << 20)
	}
	return w, nil
}

// fwdShare is the forward's part of a step's compute without
// checkpointing: a backward computes two products for each of the
// forward's (the input's gradient and the weight's), so a third. A LoRA
// job's backward skips the frozen weights' gradients, but the profile
// measures its step as a whole, and the split only places the disk's
// work against compute.
const fwdShare = 1.0 / 3

// predictStep fills pr's terms, step and bottleneck from the profile's
// rates (the time model: the package doc).
func predictStep(pr *Prediction, p *Profile, c Compute, disk Disk, in Inputs, w work, paramsExtra float64) {
	t := pr.Terms
	psi := w.trainable
	compute, devAdam := c.FwdBwdSeconds, c.DeviceAdamSeconds
	if in.SharedCores {
		// The CPU backend's AdamStep is cpuadam, enqueued on the
		// stream: its time lands in the next step's compute. Take it
		// out at cpuadam's rate.
		devAdam = psi / p.AdamParamsPerS
		compute = math.Max(c.FwdBwdSeconds+c.DeviceAdamSeconds-devAdam, 0)
	}
	fwd := compute * fwdShare
	if pr.Checkpoint {
		// The blocks' forward again in the backward, as the
		// checkpointed step measured it.
		compute += max(c.CheckpointFwdBwdSeconds-c.FwdBwdSeconds, 0)
	}
	// Accumulation: each micro-batch's forward and backward, one update.
	acc := float64(max(in.Accum, 1))
	compute, fwd = compute*acc, fwd*acc
	t["compute"] = compute
	var copyUpd, copyDown, copyPass float64 // bytes: the new params up, the gradient down, the params' passes up
	if pr.Optimizer == shard.HBM {
		t["adam"] = devAdam
	} else {
		t["adam"] = psi / p.AdamRate(pr.Moments, pr.Master)
		copyUpd, copyDown = 2*psi, 2*psi // bf16
	}
	paramBytes, passes, _ := paramPasses(pr, in, w)
	if passes > 0 {
		copyPass = passes * paramBytes
		if f := in.Job.coded(); f != "" {
			t["decode"] = passes * w.frozen / p.DecodeRate(f)
		}
	}
	t["copy"] = (copyUpd + copyDown + copyPass) / p.CopyBytesPerS
	if pr.Params != shard.HBM {
		// What offloaded params cost beyond their copies, as the measured
		// step with the params in host RAM shows it (paramsOverhead).
		t["params"] = paramsExtra * acc
	}
	// The disk: the update's reads and writes (the optimizer state, the
	// new params' home) run under the next forward (overlap exact, after
	// the clipped backward); the params' reads, half in the forwards and
	// half in the backwards. What the tier store's host room keeps from
	// step to step does not move: as much as the NVMe probe measured kept
	// in a placement of the same state's precision (Compute.NVMeKept*,
	// NarrowKept*), the update's reads first.
	updRead, updWrite, passRead := diskBytes(pr, in, w)
	kr, kw := c.NVMeKeptReadBytes, c.NVMeKeptWriteBytes
	if pr.Narrow() {
		kr, kw = c.NarrowKeptReadBytes, c.NarrowKeptWriteBytes
	}
	if kr > 0 {
		passRead -= max(kr-updRead, 0)
		updRead, passRead = max(updRead-kr, 0), max(passRead, 0)
	}
	updWrite = max(updWrite-kw, 0)
	if pr.Optimizer != shard.HBM && c.OffloadStepSeconds > 0 {
		// The host path's cost beyond CPU Adam and the copies, as the
		// measured ZeRO-Offload step shows it.
		t["staging"] = math.Max(c.OffloadStepSeconds-c.FwdBwdSeconds-c.DeviceAdamSeconds-psi/p.AdamParamsPerS-4*psi/p.CopyBytesPerS, 0)
	}
	// The engine's moves get a share of the drive's probed rates that
	// depends on the model's shard sizes and the host's staging room,
	// measured on the engine's own timeline (Compute.NVMeEfficiency).
	eff := 1.0
	if c.NVMeEfficiency > 0 && c.NVMePath == in.NVMePath {
		eff = c.NVMeEfficiency
	}
	// The update's reads gate the forward (each chunk's state before its
	// update); its writes go behind, and as many as the host's staging
	// room holds beside what it keeps drain under the backward.
	trail := min(updWrite, max(float64(pr.stagingBytes)-kr, 0))
	diskFwd := disk.seconds(updRead+passRead/2, updWrite-trail) / eff
	diskBwd := disk.seconds(passRead/2, trail) / eff
	if d := disk.seconds(updRead+passRead, updWrite) / eff; d > 0 {
		t["disk"] = d
	}
	// Two phases: the forward, with the update under it, and the
	// backward, with the update's trailing writes; in each the slowest of
	// the devices' work and the disk's.
	rate := p.CopyBytesPerS
	fwdDev := fwd + (copyUpd+copyPass/2)/rate + (t["decode"]+t["params"])/2
	bwdDev := compute - fwd + (copyDown+copyPass/2)/rate + (t["decode"]+t["params"])/2
	if in.SharedCores {
		// The devices are the host's cores: the update and its staging
		// add to the forward's compute.
		fwdDev += t["adam"] + t["staging"]
		pr.StepSeconds = max(fwdDev, diskFwd) + max(bwdDev, diskBwd)
	} else {
		pr.StepSeconds = max(fwdDev, t["adam"]+t["staging"], diskFwd) + max(bwdDev, diskBwd)
	}
	pr.Bottleneck = bottleneck(t)
}

// paramPasses is how offloaded params come up to the devices in a step:
// the bytes of one pass as stored off the devices (a coded base as
// stored, decoded on the devices; of a mixture of experts, the experts
// the tokens reach: work.passShare) and how many passes. They stay staged
// in the devices' spare memory when they fit there (cached: the tier
// store keeps them in HBM between the forward and the backward, and from
// step to step, so only the new params go up); else they come up for
// each micro-batch's forward and backward.
func paramPasses(pr *Prediction, in Inputs, w work) (passBytes, passes float64, cached bool) {
	if w.frozen == 0 {
		passBytes = 2 * w.trainable * w.passShare
	} else {
		passBytes = 2*w.trainable + w.codedBytes*w.frozen*w.passShare
	}
	cached = in.HBMBytes-pr.DeviceBytes >= int64(2*(w.trainable+w.frozen))
	if pr.Params != shard.HBM && !cached {
		passes = 2 * float64(max(in.Accum, 1))
	}
	return passBytes, passes, cached
}

// diskBytes is the NVMe bytes a step of pr would move with nothing kept
// in host RAM between steps: the update's reads and writes (the
// optimizer state; the new params' home, and with a remainder master the
// params it completes) and the params' passes' reads.
func diskBytes(pr *Prediction, in Inputs, w work) (updRead, updWrite, passRead float64) {
	psi := w.trainable
	if pr.Optimizer == shard.NVMe {
		b := pr.optOptions().OptimizerBytesPerParam() * psi
		updRead, updWrite = b, b
	}
	if pr.Params == shard.NVMe {
		passBytes, passes, cached := paramPasses(pr, in, w)
		updWrite += 2 * psi // the new params' home
		passRead = passBytes * passes
		if pr.Master == NarrowMaster && !cached {
			updRead += 2 * psi // the update reads the params the remainder completes
		}
	}
	return updRead, updWrite, passRead
}

// paramsOverhead is what offloaded params cost a step beyond their copies
// (the stage-3 gathers of the params from the tier store into the
// devices' buffers, its param staging, the new params' round trip): the
// measured step of the job's placement with params and optimizer state in
// host RAM (Compute.HostParamsStepSeconds) over what the other terms
// predict for it; 0 when not measured.
func paramsOverhead(p *Profile, c Compute, disk Disk, in Inputs, w work) (float64, error) {
	if c.HostParamsStepSeconds == 0 {
		return 0, nil
	}
	ref := Config{Name: "host params", Stage: 3, Optimizer: shard.Host, Params: shard.Host, Moments: c.HostParamsMoments, Master: c.HostParamsMaster}
	if p.AdamRate(ref.Moments, ref.Master) <= 0 {
		return 0, &MeasurementError{Inputs: in, Lacks: fmt.Sprintf("lacks CPU Adam's rate with %s moments and a %s master", ref.Moments, ref.Master)}
	}
	one := in
	one.Accum = 1              // the probe's step is one micro-batch
	if one.Job.coded() != "" { // measured with the base in bf16 (computeInputs)
		l := *one.Job.LoRA
		l.BaseDType = config.BaseBF16
		one.Job = Job{LoRA: &l}
		var err error
		if w, err = workOf(one); err != nil {
			return 0, err
		}
	}
	pr, err := fit(one, []Config{ref})
	if err != nil {
		return 0, err
	}
	predictStep(&pr[0], p, c, disk, one, w, 0)
	return max(c.HostParamsStepSeconds-pr[0].StepSeconds, 0), nil
}

// seconds is what reads and writes bytes take on d: the larger of the
// reads at the read rate and the writes at the write rate, and both at
// the rate of both at once (0 for no bytes).
func (d Disk) seconds(read, write float64) float64 {
	if read+write == 0 {
		return 0
	}
	s := read/d.ReadBytesPerS + write/d.WriteBytesPerS
	if d.MixedBytesPerS > 0 {
		s = max(read/d.ReadBytesPerS, write/d.WriteBytesPerS, (read+write)/d.MixedBytesPerS)
	}
	return s
}

// TieFraction is how close two predicted steps are one rank: a placement
// whose step is within 10 % of its rank's fastest shares that rank. The
// predictions of placements that do the same work (stage 0 and 1 resident
// on one device) differ by less than 1 %, below what a step's median moves
// on a shared host between two interleaved measurements (up to ~10 % here,
// docs/plan.md): an order among them is not a prediction, and --check
// compares the order of ranks, not of ties.
const TieFraction = 0.10

// rank sets the Rank of the fitting predictions, sorted fastest first.
func rank(preds []Prediction) {
	r, first := 0, 0.0
	for i := range preds {
		pr := &preds[i]
		if !pr.Fits {
			continue
		}
		if r == 0 || pr.StepSeconds > first*(1+TieFraction) {
			r, first = r+1, pr.StepSeconds
		}
		pr.Rank = r
	}
}

// RankLeaders returns the fastest placement of each of the first n ranks
// of preds (Predict's order): what --check runs to test the ranking.
func RankLeaders(preds []Prediction, n int) []Prediction {
	var out []Prediction
	for _, pr := range preds {
		if pr.Fits && pr.Rank > len(out) && len(out) < n {
			out = append(out, pr)
		}
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// bottleneck names the largest term: compute, CPU Adam, PCIe (the
// copies) or disk.
func bottleneck(t map[string]float64) string {
	names := map[string]string{"compute": "compute", "adam": "CPU Adam", "copy": "host↔device copies", "staging": "host optimizer's staging",
		"params": "offloaded params' staging", "decode": "the base's decoding", "disk": "disk"}
	best, at := -1.0, ""
	for _, k := range []string{"compute", "adam", "copy", "staging", "params", "decode", "disk"} {
		if t[k] > best {
			best, at = t[k], k
		}
	}
	return names[at]
}

// memory fills the prediction's bytes per tier (estimate.Memory, the
// activations and the working set of one micro-batch, as `strata
// estimate` counts them) and whether they fit the budgets of in.
func memory(pr *Prediction, l *model.Layout, in Inputs) (err error) {
	o := pr.optOptions()
	o.Devices, o.Stage, o.OptimizerTier, o.ParamTier = in.Devices, pr.Stage, pr.Optimizer, pr.Params
	o.ChunkParams, o.ShardAlignElems = estimate.ChunkParams(l), estimate.DefaultShardAlignElems
	lo := in.Job.modelLoRA()
	if lo != nil {
		// The base frozen, params only; coded in its offload tier.
		if o.Frozen, err = estimate.FrozenChunks(l, nil); err != nil {
			return err
		}
		if pr.Params != shard.HBM {
			o.FrozenParamDType = lo.Base
		}
	}
	e, err := estimate.Memory(o)
	if err != nil {
		return fmt.Errorf("plan: %s: %w", pr.Name, err)
	}
	ao := model.ActivationOptions{DType: gpu.BF16, LoRA: lo}
	if pr.Checkpoint {
		ao.Checkpoint = in.Shape.Layers
	}
	act := estimate.Activations(in.Shape, in.Batch, in.Seq, ao)
	pr.DeviceBytes = e.DeviceBytes() + act.DeviceBytes() + estimate.WorkingSetOf(e, max(in.Accum, 1)).Bytes()
	pr.HostBytes, pr.NVMeBytes = pinnedHostBytes(e, pr), e.NVMeBytes()
	pr.stagingBytes = int64(e.Options.Local()) * e.HostStagingPerRank
	var short []string
	if in.HBMBytes > 0 && pr.DeviceBytes > in.HBMBytes {
		short = append(short, fmt.Sprintf("device memory: %s needed, %s per device (%s short)",
			units.FormatBytes(pr.DeviceBytes), units.FormatBytes(in.HBMBytes), units.FormatBytes(pr.DeviceBytes-in.HBMBytes)))
	}
	host, of := pr.HostBytes, ""
	if in.SharedCores {
		// The CPU backend's devices are host RAM too, and the tier store
		// takes what is left of each for param shards: a placement whose
		// devices and pinned pool together pass the RAM is killed (a 2B
		// model's host placement was, twice, at 24 GB).
		host += int64(in.Devices) * deviceFill(e, pr, in)
		of = fmt.Sprintf(" (%s of it the CPU backend's device memory)", units.FormatBytes(host-pr.HostBytes))
	}
	if in.HostBytes > 0 && host > in.HostBytes {
		short = append(short, fmt.Sprintf("host RAM: %s needed%s, %s available (%s short)",
			units.FormatBytes(host), of, units.FormatBytes(in.HostBytes), units.FormatBytes(host-in.HostBytes)))
	}
	if pr.NVMeBytes > 0 && pr.NVMeBytes > in.NVMeFreeBytes {
		short = append(short, fmt.Sprintf("NVMe: %s needed, %s free on %s (%s short)",
			units.FormatBytes(pr.NVMeBytes), units.FormatBytes(in.NVMeFreeBytes), in.NVMePath, units.FormatBytes(pr.NVMeBytes-in.NVMeFreeBytes)))
	}
	pr.Fits, pr.Short = len(short) == 0, strings.Join(short, "; ")
	return nil
}

// pinnedHostBytes is the host RAM a placement's tier store pins, all
// ranks: the pool tier.PlanBudgets makes (the engine's own arithmetic),
// which beyond the homes holds the staging and spare room and, where
// shards come and go, a quarter more against fragmentation: at gpt2-774m
// with params and optimizer in host RAM 8.63 GiB for 5.88 GiB of homes,
// all of it resident (locked). Without a tier store (nothing offloaded)
// it is the homes, none.
func pinnedHostBytes(e estimate.ModelState, pr *Prediction) int64 {
	if pr.Optimizer == shard.HBM && pr.Params == shard.HBM {
		return e.HostBytes()
	}
	b, err := tier.PlanBudgets(tier.Sizes{Ranks: e.Options.Local(), HBMFreeBytes: math.MaxInt64 / 4,
		HomeBytes: e.TierBytes(shard.Host), StagingBytes: e.HostStagingPerRank, SpareBytes: estimate.TierSpareBytes(e.ShardElems),
		Static: pr.Params == shard.HBM && pr.Optimizer == shard.Host, OptimizerOnHost: pr.Optimizer == shard.Host})
	if err != nil {
		return e.HostBytes() // no host budget is set: PlanBudgets' errors are the budget's
	}
	return b.PoolBytes
}

// deviceFill is what one CPU backend device takes of the host's RAM: the
// placement's device memory and, with offloaded params, the tier store's
// room for their shards in "HBM", which by default is what is left of the
// device's budget, up to every shard the rank stages (tier.PlanBudgets).
func deviceFill(e estimate.ModelState, pr *Prediction, in Inputs) int64 {
	if pr.Params == shard.HBM {
		return pr.DeviceBytes
	}
	var staged int64
	for c, se := range e.ShardElems {
		if !e.Options.Persistent(c) {
			staged += estimate.IOBytes(2 * se)
		}
	}
	fill := pr.DeviceBytes + staged
	if in.HBMBytes > 0 {
		fill = min(fill, max(in.HBMBytes, pr.DeviceBytes))
	}
	return fill
}

// optOptions are c's optimizer state precisions as estimate takes them.
func (c Config) optOptions() estimate.Options {
	mo, _ := estimate.ParseMoments(c.Moments)
	ma, _ := estimate.ParseMaster(c.Master)
	return estimate.Options{MomentsDType: mo, MasterDType: ma}
}

// ConfigJSON is the config that trains in.Model in placement c (what
// `strata plan --write-config` writes and `--check` runs): the batch, the
// stage, the tiers (NVMe under in.NVMePath), the optimizer state's
// precision, bf16, AdamW's defaults.
func ConfigJSON(c Config, in Inputs) string {
	dev := func(t shard.Tier) string {
		if t == shard.NVMe {
			return fmt.Sprintf(`{"device": "nvme", "nvme_path": %q}`, in.NVMePath)
		}
		return fmt.Sprintf(`{"device": %q}`, estimate.DeviceName(t))
	}
	off := fmt.Sprintf(`, "offload_optimizer": %s`, dev(c.Optimizer))
	ckpt := ""
	if c.Checkpoint {
		ckpt = "\n  \"activation_checkpointing\": {},"
	}
	if c.Stage == 3 {
		off += fmt.Sprintf(`, "offload_param": %s`, dev(c.Params))
	}
	return fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": %d,
  "gradient_accumulation_steps": %d,
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": %d%s},%s
  "strata": {"model": %q, "devices": %d, "seq_len": %d, "optimizer_state": {"moments": %q, "master": %q}%s}
}
`, in.Batch, max(in.Accum, 1), c.Stage, off, ckpt, in.Model, in.Devices, in.Seq, c.Moments, c.Master, in.Job.configJSON())
}
