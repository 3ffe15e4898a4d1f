package plan

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// What `strata plan` does, as one call: the machine's budgets, the
// profile (loaded, the missing parts measured and saved), the
// predictions, and with Check the measured steps of the top placements.

// Options are a plan's question and how to answer it.
type Options struct {
	// Model names the model as the profile records its steps; Shape is
	// its shape.
	Model string
	Shape model.Shape
	// Job is what trains: a full fine-tune (the zero value) or LoRA.
	Job Job
	// Devices, Batch (rows per device per micro-batch), Accum
	// (micro-batches a step; 0 is 1) and Seq (tokens a row).
	Devices, Batch, Accum, Seq int
	// NVMePath is a directory on the NVMe drive: adds the NVMe placements.
	NVMePath string
	// HBMBytes is each device's memory (0: the backend's).
	HBMBytes int64
	// Backend is "cpu" or "cuda".
	Backend string
	// Probe measures the machine again, replacing the profile's figures.
	Probe bool
	// ProfilePath is the profile file ("": $STRATA_PROFILE, else the
	// default; ProfilePath resolves it).
	ProfilePath string
	// Check trains the top placements a few steps each: the fastest of
	// each of the first CheckRanks ranks, or with CheckTop > 0 the top
	// CheckTop placements, in CheckRounds rounds (each placement in turn,
	// 2 warm-up steps and 3 measured).
	Check                             bool
	CheckRanks, CheckTop, CheckRounds int
	// CheckMatch, when set, checks the placements whose names it matches
	// instead (that fit, in the predicted order).
	CheckMatch *regexp.Regexp
	// Progress, when set, is told what is measured, a line each, before
	// it is.
	Progress func(line string)
}

// NVMePathError is Run's refusal of an Options.NVMePath that is no
// writable directory.
type NVMePathError struct {
	Path string
	Err  error
}

// Error says the path is refused and why.
func (e *NVMePathError) Error() string { return "plan: NVMe path: " + e.Err.Error() }

// Unwrap is Err.
func (e *NVMePathError) Unwrap() error { return e.Err }

// Result is a plan's answer.
type Result struct {
	Inputs      Inputs
	ProfilePath string
	// Profile is the machine's (nil when nothing fits: nothing measured).
	Profile *Profile
	// Predictions are Predict's, fastest that fits first; when nothing
	// fits (Fits false) Fit's, each with its shortfall.
	Predictions []Prediction
	Fits        bool
	// Measured is the median step of each placement Check ran, by name.
	Measured map[string]float64
}

// Run answers o on this machine: every placement with its memory and
// predicted step, the profile measured where it lacks a figure (and
// saved), and with o.Check the measured steps beside the predictions.
// Nothing fitting is no error: Result.Fits is false.
func Run(ctx context.Context, o Options) (*Result, error) {
	in, machine, err := machineInputs(o)
	if err != nil {
		return nil, err
	}
	fits, err := Fit(in)
	if err != nil {
		return nil, err
	}
	r := &Result{Inputs: in, Predictions: fits, Measured: map[string]float64{}}
	first := slices.IndexFunc(fits, func(f Prediction) bool { return f.Fits })
	if first < 0 {
		return r, nil
	}
	r.Fits = true
	if r.ProfilePath, _, err = ProfilePath(o.ProfilePath); err != nil {
		return nil, err
	}
	if r.Profile, err = loadProfile(r.ProfilePath, machine, o.Probe); err != nil {
		return nil, err
	}
	changed, err := measure(ctx, r.Profile, in, fits, first, o)
	if err != nil {
		return nil, err
	}
	if changed {
		if err := r.Profile.Save(r.ProfilePath); err != nil {
			return nil, err
		}
	}
	if r.Predictions, err = Predict(r.Profile, in); err != nil {
		return nil, err
	}
	if o.Check {
		if r.Measured, err = check(ctx, r.Predictions, in, o); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// machineInputs are o's question with this machine's budgets: the backend's
// first device's memory, the host's available RAM, the NVMe path's room.
func machineInputs(o Options) (Inputs, Machine, error) {
	in := Inputs{Model: o.Model, Shape: o.Shape, Job: o.Job, Accum: max(o.Accum, 1), Devices: o.Devices, Batch: o.Batch, Seq: o.Seq,
		NVMePath: o.NVMePath, SharedCores: o.Backend == "cpu"}
	devs, err := backend.Open(o.Backend, 1, o.HBMBytes, true)
	if err != nil {
		return in, Machine{}, err
	}
	in.HBMBytes = devs.Devs[0].MemStats().BudgetBytes
	machine := ThisMachine(o.Backend, devs.Devs[0].Name())
	devs.Close()
	if avail, ok := hostmem.Available(hostmem.MeminfoPath); ok {
		in.HostBytes = avail
	}
	if in.NVMePath != "" {
		if in.NVMeFreeBytes, err = NVMeRoom(in.NVMePath); err != nil {
			return in, machine, &NVMePathError{Path: in.NVMePath, Err: err}
		}
	}
	return in, machine, nil
}

// loadProfile is the profile at path, checked against machine; a new one
// when there is none or probe measures again.
func loadProfile(path string, machine Machine, probe bool) (*Profile, error) {
	p, err := Load(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || probe:
		return NewProfile(machine), nil
	case err != nil:
		return nil, err
	}
	if err := p.Check(machine); err != nil {
		return nil, fmt.Errorf("%w: %s", err, path)
	}
	return p, nil
}

// measure probes what p lacks for in: the model's step first, on a quiet
// heap (fits[first] is the first placement that fits), then the rates.
func measure(ctx context.Context, p *Profile, in Inputs, fits []Prediction, first int, o Options) (changed bool, err error) {
	say := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf(format, args...))
		}
	}
	cm, ok := p.Compute(in.Model, in.Job, in.Devices, in.Batch, in.Seq)
	pin, fits, first, err := computeInputs(in, fits, first)
	if err != nil {
		return false, err
	}
	if !ok {
		say("plan: measuring a step of %s (%s) ...", in.Model, jobPlacement(pin.Job, fits[first].Name))
		if cm, err = ProbeCompute(ctx, fits[first].Config, pin, o.Backend); err != nil {
			return false, err
		}
		cm.Job = in.Job.computeKey()
		if fits[first].Checkpoint { // only checkpointed placements fit: that is the step
			cm.CheckpointFwdBwdSeconds = cm.FwdBwdSeconds
		}
		for _, f := range fits {
			if cm.OffloadStepSeconds > 0 {
				break // the compute was measured in a ZeRO-Offload placement: that step
			}
			if f.Fits && f.Optimizer == shard.Host && f.Params == shard.HBM && f.Checkpoint == fits[first].Checkpoint {
				say("plan: measuring a step of %s (%s) ...", in.Model, jobPlacement(pin.Job, f.Name))
				if err := ProbeOffload(ctx, &cm, f.Config, pin, o.Backend); err != nil {
					return false, err
				}
				break
			}
		}
		p.SetCompute(cm)
		changed = true
	}
	if cm.HostParamsStepSeconds == 0 {
		// The params in host RAM at stage 3: what offloaded params cost.
		if i := slices.IndexFunc(fits, func(f Prediction) bool {
			return f.Fits && f.Stage == 3 && f.Optimizer == shard.Host && f.Params == shard.Host && !f.Checkpoint
		}); i >= 0 {
			say("plan: measuring a step of %s (%s) ...", in.Model, jobPlacement(pin.Job, fits[i].Name))
			s, err := TimeConfig(ctx, fits[i].Config, pin, o.Backend, 2, 6)
			if err != nil {
				return false, err
			}
			cm.HostParamsStepSeconds, cm.HostParamsMoments, cm.HostParamsMaster = units.Median(s), fits[i].Moments, fits[i].Master
			p.SetCompute(cm)
			changed = true
		}
	}
	if cm.CheckpointFwdBwdSeconds == 0 && !fits[first].Checkpoint {
		ck := fits[first].Config
		ck.Name, ck.Checkpoint = ck.Name+", activation checkpointing", true
		say("plan: measuring a step of %s (%s) ...", in.Model, jobPlacement(pin.Job, ck.Name))
		if err := ProbeCheckpoint(ctx, &cm, ck, pin, o.Backend); err != nil {
			return false, err
		}
		p.SetCompute(cm)
		changed = true
	}
	if _, ok := p.Disk(in.NVMePath); in.NVMePath != "" && !ok {
		say("plan: measuring %s (256 MiB written, then read) ...", in.NVMePath)
		d, err := ProbeDisk(ctx, in.NVMePath, 0)
		if err != nil {
			return false, err
		}
		p.SetDisk(d)
		changed = true
	}
	if d, ok := p.Disk(in.NVMePath); ok && cm.NVMePath != in.NVMePath {
		// The engine's share of the drive's rates, on its own timeline:
		// the job's first NVMe placement that fits.
		if i := slices.IndexFunc(fits, func(f Prediction) bool { return f.Fits && (f.Optimizer == shard.NVMe || f.Params == shard.NVMe) }); i >= 0 {
			var narrow *Prediction
			if j := slices.IndexFunc(fits, func(f Prediction) bool { return f.Fits && f.Narrow() && f.Optimizer == shard.NVMe }); j >= 0 && j != i {
				narrow = &fits[j]
				say("plan: measuring the engine's NVMe traffic in %s and %s (2 steps each) ...", jobPlacement(pin.Job, fits[i].Name), fits[j].Name)
			} else {
				say("plan: measuring the engine's NVMe traffic in %s (2 steps) ...", jobPlacement(pin.Job, fits[i].Name))
			}
			if err := ProbeNVMe(ctx, &cm, fits[i], narrow, pin, o.Backend, d); err != nil {
				return false, err
			}
			p.SetCompute(cm)
			changed = true
		}
	}
	if !p.hasRates() {
		say("plan: measuring host↔device copies and CPU Adam ...")
		if err := ProbeRates(ctx, p, o.Backend, o.HBMBytes, 0); err != nil {
			return false, err
		}
		changed = true
	}
	return changed, nil
}

// computeInputs are the question and placements whose step the profile's
// compute of in is measured in: in's, except that a coded base's job is
// measured with its base in bf16 (on the devices when it fits them), its
// decoding added per placement (Profile.Decodes).
func computeInputs(in Inputs, fits []Prediction, first int) (Inputs, []Prediction, int, error) {
	if in.Job.coded() != "" {
		name := in.Job.Name()
		l := *in.Job.LoRA
		l.BaseDType = config.BaseBF16
		in.Job = Job{LoRA: &l}
		var err error
		if fits, err = Fit(in); err != nil {
			return in, nil, 0, err
		}
		if first = slices.IndexFunc(fits, func(f Prediction) bool { return f.Fits }); first < 0 {
			return in, nil, 0, fmt.Errorf("plan: %s with a bf16 base fits no placement: the step a coded base's prediction starts from cannot be measured", name)
		}
	}
	return in, fits, computePlacement(fits, first), nil
}

// computePlacement is the placement whose step the compute is measured
// in: the first that fits with nothing on NVMe (a step that waits for the
// disk is no measure of the devices' work), else the first that fits
// with the least optimizer state on NVMe (the narrow state), else first.
// ProbeCompute reads an NVMe placement's compute from the compute
// stream's busy time, not its step.
func computePlacement(fits []Prediction, first int) int {
	if i := slices.IndexFunc(fits, func(f Prediction) bool {
		return f.Fits && f.Optimizer != shard.NVMe && f.Params != shard.NVMe
	}); i >= 0 {
		return i
	}
	if i := slices.IndexFunc(fits, func(f Prediction) bool { return f.Fits && f.Narrow() }); i >= 0 {
		return i
	}
	return first
}

// jobPlacement names a placement of job ("stage 0, resident; LoRA r 16
// on q_proj, v_proj"); a full fine-tune's as it is.
func jobPlacement(job Job, placement string) string {
	if job.LoRA == nil {
		return placement
	}
	return placement + "; " + job.Name()
}

// check runs the top placements of preds round by round, each in turn (2
// warm-up steps, 3 measured), so that the host's drifts fall on all of
// them alike; the median of every round's steps, by name.
func check(ctx context.Context, preds []Prediction, in Inputs, o Options) (map[string]float64, error) {
	top := RankLeaders(preds, o.CheckRanks)
	if o.CheckMatch != nil {
		top = nil
		for _, pr := range preds {
			if pr.Fits && o.CheckMatch.MatchString(pr.Name) {
				top = append(top, pr)
			}
		}
		if len(top) == 0 {
			return nil, fmt.Errorf("plan: --check-match %q matches no placement that fits", o.CheckMatch)
		}
	} else if k := o.CheckTop; k > 0 {
		top = nil
		for i, pr := range preds {
			if i < k && pr.Fits {
				top = append(top, pr)
			}
		}
	}
	steps := map[string][]float64{}
	rounds := max(o.CheckRounds, 1)
	for r := range rounds {
		for _, pr := range top {
			if o.Progress != nil {
				o.Progress(fmt.Sprintf("plan: round %d/%d: %s ...", r+1, rounds, pr.Name))
			}
			s, err := TimeConfig(ctx, pr.Config, in, o.Backend, 2, 3)
			if err != nil {
				return nil, err
			}
			steps[pr.Name] = append(steps[pr.Name], s...)
		}
	}
	measured := map[string]float64{}
	for name, s := range steps {
		slices.Sort(s)
		measured[name] = s[len(s)/2]
	}
	return measured, nil
}

// BestConfigJSON is the config of the fastest placement that fits
// (strata plan --write-config).
func (r *Result) BestConfigJSON() string { return ConfigJSON(r.Predictions[0].Config, r.Inputs) }
