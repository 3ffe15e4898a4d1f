package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/timeline"
)

// StepOptions configure `strata bench step`: one model and batch trained at
// ZeRO stage 3 with everything resident on the devices, with params and
// optimizer state offloaded to host RAM, and offloaded to NVMe, the three
// engines stepping alternately (interleaved rounds) so that the noise of a
// shared machine falls on all of them alike.
type StepOptions struct {
	Model   string // a named model shape; default "medium" (6.4M params: compute bounds the step)
	Devices int    // devices (ranks); default 1
	Backend string // "cpu" (default) or "cuda"
	Batch   int    // rows per device per step (train_micro_batch_size_per_gpu); default 4
	Seq     int    // tokens per row; default 256
	Steps   int    // measured steps per mode; default 5
	// Block is the steps each engine takes in a row per measured round,
	// the first not measured when Block > 1; default 1: one measured step
	// per engine and round (a pending exact update then always runs on an
	// idle device, so compare overlaps with 3, the CLI's default).
	Block    int
	Warmup   int    // steps per mode before measuring (the first records the trace); default 2
	NVMePath string // directory of the swap file; default /var/tmp
	// NVMeOptimizer puts the optimizer state on NVMe too in the NVMe mode
	// (default: only the params; the optimizer state stays in host RAM as
	// in the host mode, so the ratio is that of the params' tier).
	NVMeOptimizer bool
	// ProbeBytes is the file the disk probe writes, reads and mixes under
	// NVMePath before the steps, for the drive's rates in each mode's
	// Resources (0: the run's NVMe working set, at least stepProbeBytes;
	// see probeBytes).
	ProbeBytes int64
	// HostBudgetBytes is strata.host_budget of the NVMe mode (0: the tier
	// store's minimum: staging room only).
	HostBudgetBytes int64
	HBMBytes        int64 // per-device budget; default 8 GiB (host memory is used only as allocated)
	// TierHBMBytes is the tier store's share of each device (the param
	// shards staged in HBM) in the offloaded modes; 0: what is left.
	TierHBMBytes int64
	Threads      int // cpuadam threads; 0: GOMAXPROCS
	// Modes to run, among "resident", "host", "nvme" (the default) and
	// "offload" (ZeRO-Offload: the optimizer state in host RAM, the params
	// on the devices).
	Modes []string
	// Overlaps are the host optimizer's schedules each offloaded mode runs
	// with, among StepOverlaps: strata.overlap's "serial", "exact" and
	// "dpu", and OverlapBackward; default exact. Each (mode, overlap) is
	// one engine; all step alternately.
	Overlaps []string
	// GradientClipping is every engine's gradient_clipping (the CLI's
	// default 1.0; 0: none).
	GradientClipping float64
	// Moments are the precisions of Adam's moments
	// (strata.optimizer_state.moments) each offloaded mode runs with,
	// among "fp32" (the default), "bf16" and "int8", each optionally
	// followed by RemainderSuffix (the master as strata.optimizer_state.master
	// "bf16+remainder": "int8+remainder"): an engine each, all stepping
	// alternately.
	Moments []string
	// Trains are what each run trains: "full" (every weight, the default),
	// "lora" (strata.lora of rank LoRARank, alpha twice that, on every
	// linear of the blocks, the base frozen) and "qlora" (the same with the
	// base stored in NF4 in the tiers: strata.lora.base_dtype, the
	// offloaded modes only): an engine each, stepping alternately with the
	// others.
	Trains   []string
	LoRARank int // default 16
	// TracePath, when set, receives the Chrome trace-event timeline of the
	// last mode (timeline.Tracer); with several modes their alternating
	// steps fall inside its step windows, so trace one mode (--modes nvme).
	TracePath string
}

// StepModes are the placements `strata bench step` compares, the first
// three by default.
var StepModes = []string{"resident", "host", "nvme", "offload"}

// StepOverlaps are the host optimizer's schedules it compares.
var StepOverlaps = []string{engine.OverlapSerial, engine.OverlapExact, engine.OverlapDPU, OverlapBackward}

// OverlapBackward is the bench's name for overlap "exact" with
// strata.update_in_backward: cpuadam begins in the backward, as if the step
// were not clipped.
const OverlapBackward = "backward"

// WithDefaults fills the zero fields.
func (o StepOptions) WithDefaults() StepOptions {
	if o.Model == "" {
		o.Model = "medium"
	}
	if o.Devices == 0 {
		o.Devices = 1
	}
	if o.Backend == "" {
		o.Backend = "cpu"
	}
	if o.Batch == 0 {
		o.Batch = 4
	}
	if o.Seq == 0 {
		o.Seq = 256
	}
	if o.Steps == 0 {
		o.Steps = 5
	}
	if o.Warmup == 0 {
		o.Warmup = 2
	}
	if o.Block == 0 {
		o.Block = 1
	}
	if o.NVMePath == "" {
		o.NVMePath = "/var/tmp"
	}
	if o.HBMBytes == 0 {
		o.HBMBytes = 8 * units.GiB
	}
	if len(o.Modes) == 0 {
		o.Modes = StepModes[:3]
	}
	if len(o.Overlaps) == 0 {
		o.Overlaps = []string{engine.OverlapExact}
	}
	if len(o.Moments) == 0 {
		o.Moments = []string{config.MomentsFP32}
	}
	if len(o.Trains) == 0 {
		o.Trains = []string{"full"}
	}
	if o.LoRARank == 0 {
		o.LoRARank = 16
	}
	return o
}

// Validate says what is wrong with o (after WithDefaults).
func (o StepOptions) Validate() error {
	s, err := model.Lookup(o.Model)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	switch {
	case o.Devices < 1 || o.Batch < 1 || o.Seq < 1 || o.Steps < 1 || o.Warmup < 1 || o.Block < 1:
		return fmt.Errorf("bench: devices %d, batch %d, seq %d, steps %d, warmup %d, block %d must be >= 1", o.Devices, o.Batch, o.Seq, o.Steps, o.Warmup, o.Block)
	case o.Seq > s.MaxSeq:
		return fmt.Errorf("bench: seq %d exceeds %s's max_seq_len %d", o.Seq, s.Name, s.MaxSeq)
	case o.HostBudgetBytes < 0 || o.HBMBytes < 0 || o.TierHBMBytes < 0 || o.Threads < 0 || o.ProbeBytes < 0:
		return errors.New("bench: budgets and threads must be >= 0")
	}
	if !slices.Contains(backend.Names, o.Backend) {
		return fmt.Errorf("bench: backend %q is not one of %s", o.Backend, strings.Join(backend.Names, ", "))
	}
	for _, m := range o.Modes {
		if !slices.Contains(StepModes, m) {
			return fmt.Errorf("bench: mode %q is not one of %s", m, strings.Join(StepModes, ", "))
		}
	}
	for _, v := range o.Overlaps {
		if !slices.Contains(StepOverlaps, v) {
			return fmt.Errorf("bench: overlap %q is not one of %s", v, strings.Join(StepOverlaps, ", "))
		}
	}
	for _, m := range o.Moments {
		if !slices.Contains([]string{config.MomentsFP32, config.MomentsBF16, config.MomentsInt8}, strings.TrimSuffix(m, RemainderSuffix)) {
			return fmt.Errorf("bench: moments %q is not fp32, bf16 or int8, with or without %q", m, RemainderSuffix)
		}
	}
	for _, tr := range o.Trains {
		if tr != "full" && tr != "lora" && tr != "qlora" {
			return fmt.Errorf("bench: train %q is not full, lora or qlora", tr)
		}
		if tr == "qlora" && slices.ContainsFunc(o.Modes, func(m string) bool { return m == "resident" || m == "offload" }) {
			return fmt.Errorf("bench: train qlora streams the base from host RAM or NVMe: modes host and nvme only")
		}
	}
	if o.LoRARank < 1 {
		return fmt.Errorf("bench: LoRA rank %d must be >= 1", o.LoRARank)
	}
	return nil
}

// StepConfig is the engine config of one mode (the nvme mode's swap in dir)
// with the first of Overlaps.
func (o StepOptions) StepConfig(mode, dir string) (*config.Config, error) {
	o = o.WithDefaults()
	return o.stepConfig(stepRunKey{mode, o.Overlaps[0], o.Moments[0], o.Trains[0]}, dir)
}

// stepConfig is the engine config of one run.
func (o StepOptions) stepConfig(k stepRunKey, dir string) (*config.Config, error) {
	mode := k.mode
	param, opt := "none", "none"
	switch mode {
	case "offload":
		opt = "cpu"
	case "host":
		param, opt = "cpu", "cpu"
	case "nvme":
		param, opt = "nvme", "cpu"
		if o.NVMeOptimizer {
			opt = "nvme"
		}
	}
	path := func(dev string) string {
		if dev != "nvme" {
			return ""
		}
		return fmt.Sprintf(`, "nvme_path": %q`, dir)
	}
	hb := int64(0)
	if mode == "nvme" {
		hb = o.HostBudgetBytes
	}
	master := config.MasterFP32
	if strings.HasSuffix(k.moments, RemainderSuffix) {
		master = config.MasterBF16Remainder
	}
	overlap := k.overlap
	if overlap == OverlapBackward {
		overlap = engine.OverlapExact
	}
	lora := ""
	switch k.train {
	case "lora":
		lora = fmt.Sprintf(`, "lora": {"r": %d, "alpha": %d, "target_modules": "all-linear"}`, o.LoRARank, 2*o.LoRARank)
	case "qlora":
		lora = fmt.Sprintf(`, "lora": {"r": %d, "alpha": %d, "target_modules": "all-linear", "base_dtype": "nf4"}`, o.LoRARank, 2*o.LoRARank)
	}
	js := fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": %d,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "bf16": {"enabled": true},
  "gradient_clipping": %g,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": %q%s}, "offload_optimizer": {"device": %q%s}},
  "strata": {"model": %q, "devices": %d, "seq_len": %d, "seed": 1, "host_budget": %d, "overlap": %q, "update_in_backward": %t, "dpu_warmup_steps": %d,
    "optimizer_state": {"moments": %q, "master": %q}%s}
}`, o.Batch, o.GradientClipping, param, path(param), opt, path(opt), o.Model, o.Devices, o.Seq, hb, overlap, k.overlap == OverlapBackward, o.Warmup, strings.TrimSuffix(k.moments, RemainderSuffix), master, lora)
	cfg, err := config.Parse([]byte(js), "bench-step-"+mode+".json", config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return cfg, nil
}

// StepModeResult is one mode's figures over the measured steps, with one
// overlap schedule.
type StepModeResult struct {
	Mode       string
	Overlap    string    // the host optimizer's schedule (StepOverlaps); "" in the resident mode (no host optimizer)
	Moments    string    // strata.optimizer_state.moments
	Train      string    // "full" or "lora"
	Steps      []float64 // seconds, in order
	MedianStep float64
	Optimizer  float64 // median optimizer phase, seconds
	// Tier figures summed over the measured steps (offloaded modes).
	Accesses, Hits  int64
	Dependent       int64   // report.TierStats.Dependent
	HitRate         float64 // report.TierStats.HitRate: Hits / (Accesses - Dependent)
	counts          report.PrefetchCounts
	Stall           [shard.TierCount]float64 // seconds, summed
	LinkBytes       [shard.LinkCount]int64   // per step (mean)
	PeakBytes       [shard.TierCount]int64   // the largest step peak
	BudgetBytes     [shard.TierCount]int64
	ModelStateBytes int64 // 16Ψ
	DevicePeakBytes int64 // the largest device's peak of all allocations
	FinalLoss       float64
	ParamsIdentical bool           // the params after the run equal the resident mode's, bit for bit
	Summary         report.Summary // the engine's at the end (strata bench step --summary prints it)
	// HostOpt is the host optimizer's time over the measured steps:
	// cpuadam busy time and what no compute stream hid (exposed), the
	// optimizer-state waits and their exposed part (report.HostOptStats).
	HostOpt report.HostOptStats
	// RatioSerial is MedianStep over the same mode's serial median (0 when
	// serial did not run).
	RatioSerial float64
	// Use is, per measured step, what each resource did (Resources: the
	// medians and the bound).
	Use []StepUse
	Resources
}

// Name is the mode, with the overlap when there is one and narrow
// moments ("host/exact", "nvme/exact/int8").
func (m StepModeResult) Name() string {
	n := m.Mode
	if m.Overlap != "" {
		n += "/" + m.Overlap
	}
	if m.Moments != "" && m.Moments != config.MomentsFP32 {
		n += "/" + m.Moments
	}
	if m.Train != "" && m.Train != "full" {
		n += "/" + m.Train
	}
	return n
}

// StepResult is what `strata bench step` measured.
type StepResult struct {
	Options StepOptions
	Shape   model.Shape
	Params  int64
	Tokens  int // per step
	// Backend describes the devices (backend, count, GPU).
	Backend string
	Modes   []StepModeResult
	// Ratios of median step times, when both modes ran.
	RatioNVMeHost, RatioHostResident float64
	Seconds                          float64
	// TraceMode is the mode traced to Options.TracePath; Overlap its
	// measured steps' exposed transfer time (timeline.Overlap).
	TraceMode string
	Overlap   []timeline.StepOverlap
	// Reclaimed says what the run removed of killed bench runs under
	// --nvme-path (reclaimStepDirs), a line each.
	Reclaimed []string
	// Disk is the drive under --nvme-path as ProbeDisk measured it before
	// the steps (nvme modes only; zero otherwise): the rates the modes'
	// Resources.Drive takes.
	Disk plan.Disk
}

// Mode returns the result of mode m, or nil.
func (r StepResult) Mode(m string) *StepModeResult {
	for i := range r.Modes {
		if r.Modes[i].Mode == m {
			return &r.Modes[i]
		}
	}
	return nil
}

// Step runs the benchmark: it builds one engine per mode, steps them in
// interleaved rounds, then compares the modes.
func Step(o StepOptions) (StepResult, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return StepResult{}, err
	}
	start := time.Now()
	res := StepResult{Options: o}
	r := &stepRun{o: o, engines: make([]*engine.Engine, len(o.runs()))}
	defer r.close()
	if err := r.openTrace(); err != nil {
		return res, err
	}
	defer r.abandonTrace()
	if o.hasNVMe() {
		n, err := o.probeBytes()
		if err != nil {
			return res, err
		}
		res.Options.ProbeBytes = n
		d, err := plan.ProbeDisk(context.Background(), o.NVMePath, n)
		if err != nil {
			return res, err
		}
		res.Disk = d
	}
	if err := r.build(&res); err != nil {
		return res, err
	}
	opt, err := r.rounds(&res)
	if err != nil {
		return res, err
	}
	if err := r.compare(&res, opt); err != nil {
		return res, err
	}
	if err := r.writeTimeline(&res); err != nil {
		return res, err
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// stepRun is one run of Step: an engine per mode (nil until built), the
// devices under them, the swap directories of the nvme mode, and the
// tracer of the last mode with its file.
type stepRun struct {
	o         StepOptions
	engines   []*engine.Engine
	backends  []*backend.Devices
	tmpDirs   []string
	tracer    *timeline.Tracer
	traceFile *os.File       // open until the timeline is written
	measured  map[int64]bool // the traced (last) engine's measured steps
}

// close releases the engines, then their devices, then their swap files.
func (r *stepRun) close() {
	for _, e := range r.engines {
		if e != nil {
			e.Close()
		}
	}
	for _, b := range r.backends {
		b.Close()
	}
	for _, d := range r.tmpDirs {
		os.RemoveAll(d)
	}
}

// openTrace creates the trace file now, so that a path that cannot be
// written fails before the run rather than after it.
func (r *stepRun) openTrace() (err error) {
	if r.o.TracePath == "" {
		return nil
	}
	if r.traceFile, err = os.Create(r.o.TracePath); err != nil {
		return fmt.Errorf("bench: --trace: %w", err)
	}
	return nil
}

// abandonTrace runs, before the engines close, on every way out that did
// not write the timeline: a failed run's timeline is written too (what it
// was doing), a run whose traced engine was never built leaves no empty
// file.
func (r *stepRun) abandonTrace() {
	if r.traceFile == nil {
		return
	}
	if e := r.engines[len(r.engines)-1]; e != nil {
		writeTrace(r.traceFile, e) // the run's error is the one to report
		return
	}
	r.traceFile.Close()
	os.Remove(r.o.TracePath)
}

// RemainderSuffix after a precision of StepOptions.Moments keeps the
// master as the bf16 param plus a remainder.
const RemainderSuffix = "+remainder"

// stepRunKey is one engine of the benchmark: a mode, its host optimizer's
// schedule and moments ("" and fp32 in the resident mode).
type stepRunKey struct{ mode, overlap, moments, train string }

// runs is the engines: per train, the resident mode once (no host
// optimizer), the others once per overlap and moments precision.
func (o StepOptions) runs() []stepRunKey {
	var out []stepRunKey
	for _, m := range o.Modes {
		for _, tr := range o.Trains {
			if m == "resident" {
				out = append(out, stepRunKey{m, "", config.MomentsFP32, tr})
				continue
			}
			for _, v := range o.Overlaps {
				for _, mo := range o.Moments {
					out = append(out, stepRunKey{m, v, mo, tr})
				}
			}
		}
	}
	return out
}

// stepDirPrefix names the directory of each nvme run's swap files under
// --nvme-path; the run removes it at its end.
const stepDirPrefix = "strata-bench-step-"

// staleDirAge is how old an empty step directory must be before another
// run removes it: a live run's is empty only between its MkdirTemp and its
// engine's swap files, a moment.
const staleDirAge = 10 * time.Minute

// reclaimStepDirs removes what killed bench runs left under parent: in
// each step directory the swap files no live run holds
// (nvme.ReclaimStaleSwapFiles: their lock is free), then the directory if
// that left it empty and it is staleDirAge old. A kill (SIGKILL, OOM, a
// crash) skips the run's own clean-up; without this, every killed run
// keeps its state's bytes on the drive.
func reclaimStepDirs(parent string, now time.Time) []string {
	dirs, _ := filepath.Glob(filepath.Join(parent, stepDirPrefix+"*"))
	var notes []string
	for _, d := range dirs {
		st, err := os.Stat(d) // before its files go, which touches its time
		notes = append(notes, nvme.ReclaimStaleSwapFiles([]string{d})...)
		if err == nil && st.IsDir() && now.Sub(st.ModTime()) >= staleDirAge {
			if os.Remove(d) == nil { // fails while files remain: a live run's
				notes = append(notes, fmt.Sprintf("removed the empty directory %s of a killed bench run", d))
			}
		}
	}
	return notes
}

// build opens the devices and builds the engine of each run, the last one
// traced when asked.
func (r *stepRun) build(res *StepResult) error {
	o := r.o
	var dir string
	runs := o.runs()
	for i, k := range runs {
		m := k.mode
		if m == "nvme" {
			if dir == "" {
				res.Reclaimed = append(res.Reclaimed, reclaimStepDirs(o.NVMePath, time.Now())...)
			}
			d, err := os.MkdirTemp(o.NVMePath, stepDirPrefix)
			if err != nil {
				return fmt.Errorf("bench: --nvme-path: %w", err)
			}
			dir = d
			r.tmpDirs = append(r.tmpDirs, d)
		}
		ck := k
		if ck.overlap == "" {
			ck.overlap = engine.OverlapExact
		}
		cfg, err := o.stepConfig(ck, dir)
		if err != nil {
			return err
		}
		devs, err := backend.Open(o.Backend, o.Devices, o.HBMBytes, cfg.Strata.Deterministic)
		if err != nil {
			return err
		}
		r.backends = append(r.backends, devs)
		res.Backend = devs.Describe
		eo := engine.Options{OptimizerThreads: o.Threads, HostRegistrar: devs.Registrar, Collectives: devs.Collectives}
		if o.TracePath != "" && i == len(runs)-1 {
			if r.tracer, err = timeline.NewTracer(timeline.Options{}); err != nil {
				return err
			}
			eo.Trace, res.TraceMode = r.tracer, m
		}
		if m != "resident" {
			eo.TierHBMBytes = o.TierHBMBytes
		}
		if r.engines[i], err = engine.New(cfg, devs.Devs, devs.Comms, eo); err != nil {
			return fmt.Errorf("bench: %s: %w", m, err)
		}
		res.Modes = append(res.Modes, StepModeResult{Mode: m, Overlap: k.overlap, Moments: k.moments, Train: k.train})
		res.Shape = model.Shape(*cfg.Shape())
		res.Params = r.engines[i].Layout().ParamCount()
		res.Tokens = r.engines[i].TokensPerStep()
	}
	return nil
}

// rounds steps the engines in interleaved rounds, warm-up then measured
// steps, and returns each mode's optimizer phases. Warm-up rounds take one
// step of each engine; measured rounds Block steps of each, in a row, the
// first of a block not measured when Block > 1 (an exact engine's pending
// update ran while the other engines stepped, its device idle).
func (r *stepRun) rounds(res *StepResult) ([][]float64, error) {
	opt := make([][]float64, len(r.engines))
	step := func(i int, measure bool) error {
		cpu0 := cpuTime()
		st, err := r.engines[i].Step()
		cpu := cpuTime() - cpu0
		if err != nil {
			return fmt.Errorf("bench: %s: %w", res.Modes[i].Name(), err)
		}
		mr := &res.Modes[i]
		mr.FinalLoss = st.Loss
		if !measure {
			return nil
		}
		mr.Steps = append(mr.Steps, st.Duration.Seconds())
		opt[i] = append(opt[i], st.OptimizerTime.Seconds())
		if i == len(r.engines)-1 {
			if r.measured == nil {
				r.measured = map[int64]bool{}
			}
			r.measured[st.Step] = true
		}
		u := StepUse{Compute: st.ComputeBusy, Adam: st.HostOpt.Adam, CPU: cpu}
		if st.Tier != nil {
			u.LinkActive = st.Tier.LinkActive
			u.NVMeRead, u.NVMeWrite = st.Tier.LinkBytes[shard.NVMeToHost], st.Tier.LinkBytes[shard.HostToNVMe]
		}
		mr.Use = append(mr.Use, u)
		h := &mr.HostOpt
		h.Adam += st.HostOpt.Adam
		h.AdamExposed += st.HostOpt.AdamExposed
		h.IOWait += st.HostOpt.IOWait
		h.IOExposed += st.HostOpt.IOExposed
		mr.addTier(st.Tier, r.o.Steps)
		return nil
	}
	for range r.o.Warmup {
		for i := range r.engines {
			if err := step(i, false); err != nil {
				return nil, err
			}
		}
	}
	per := max(r.o.Block-1, 1) // measured steps per block
	for done := 0; done < r.o.Steps; done += per {
		for i := range r.engines {
			if r.o.Block > 1 {
				if err := step(i, false); err != nil {
					return nil, err
				}
			}
			for range min(per, r.o.Steps-done) {
				if err := step(i, true); err != nil {
					return nil, err
				}
			}
		}
	}
	return opt, nil
}

// addTier adds one measured step's tier figures (nil: a resident mode).
func (mr *StepModeResult) addTier(t *report.TierStats, steps int) {
	if t == nil {
		return
	}
	mr.counts.Add(t.PrefetchCounts, nil)
	mr.Accesses, mr.Hits, mr.Dependent, mr.HitRate = mr.counts.Accesses, mr.counts.Hits, mr.counts.Dependent, mr.counts.HitRate
	for tr := range t.Stall {
		mr.Stall[tr] += t.Stall[tr].Seconds()
		mr.PeakBytes[tr] = max(mr.PeakBytes[tr], t.PeakBytes[tr])
	}
	mr.BudgetBytes = t.BudgetBytes
	for l, b := range t.LinkBytes {
		mr.LinkBytes[l] += b / int64(steps)
	}
}

// compare fills each mode's medians, hit rate and peaks, checks its params
// against the first mode's, and computes the ratios.
func (r *stepRun) compare(res *StepResult, opt [][]float64) error {
	var first [][]float32
	for i, e := range r.engines {
		mr := &res.Modes[i]
		mr.MedianStep = units.Median(mr.Steps)
		mr.Optimizer = units.Median(opt[i])
		mr.resources(res.Disk, runtime.NumCPU())
		if mr.counts.Accesses == 0 {
			mr.HitRate = 1 // a resident mode
		}
		mr.ModelStateBytes = 16 * res.Params
		for _, d := range e.Summary().PerDevice {
			mr.DevicePeakBytes = max(mr.DevicePeakBytes, d.PeakBytes)
		}
		mr.Summary = e.Summary()
		if len(r.engines) == 1 {
			continue // nothing to compare with
		}
		p, err := e.Params()
		if err != nil {
			return fmt.Errorf("bench: %s: %w", res.Modes[i].Name(), err)
		}
		if i == 0 {
			first = p
		}
		mr.ParamsIdentical = equalParams(p, first)
	}
	for i := range res.Modes {
		mr := &res.Modes[i]
		for _, s := range res.Modes {
			if s.Mode == mr.Mode && s.Moments == mr.Moments && s.Train == mr.Train && s.Overlap == engine.OverlapSerial && s.MedianStep > 0 {
				mr.RatioSerial = mr.MedianStep / s.MedianStep
			}
		}
	}
	if h, rr := res.Mode("host"), res.Mode("resident"); h != nil && rr != nil {
		res.RatioHostResident = h.MedianStep / rr.MedianStep
	}
	if nv, h := res.Mode("nvme"), res.Mode("host"); nv != nil && h != nil {
		res.RatioNVMeHost = nv.MedianStep / h.MedianStep
	}
	return nil
}

// writeTimeline writes the traced mode's timeline and keeps the overlap
// of its measured steps.
func (r *stepRun) writeTimeline(res *StepResult) error {
	if r.tracer == nil {
		return nil
	}
	f := r.traceFile
	r.traceFile = nil
	if err := writeTrace(f, r.engines[len(r.engines)-1]); err != nil {
		return err
	}
	for _, o := range timeline.Overlap(r.tracer.Events()) {
		if r.measured[o.Step] {
			res.Overlap = append(res.Overlap, o)
		}
	}
	return nil
}

func equalParams(a, b [][]float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// String prints the result as a table with the ratios.
func (r StepResult) String() string {
	var b strings.Builder
	o := r.Options
	for _, n := range r.Reclaimed {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	where := "params on NVMe, optimizer state in host RAM"
	if o.NVMeOptimizer {
		where = "params and optimizer state on NVMe"
	}
	fmt.Fprintf(&b, "model %s (%s params, model state %s), stage 3 on %s, %d tokens/step (batch %d x seq %d per device)\n",
		r.Shape.Name, units.FormatSize(r.Params), units.FormatBytes(16*r.Params), r.Backend, r.Tokens, o.Batch, o.Seq)
	fmt.Fprintf(&b, "modes run alternately, %d warm-up + %d measured steps each, in blocks of %d (the first of a block not measured); nvme mode: %s (swap under %s)\n",
		o.Warmup, o.Steps, o.Block, where, o.NVMePath)
	fmt.Fprintf(&b, "%-14s %10s %10s %9s %9s %10s %10s %11s %11s %11s %11s %10s\n", "mode", "step (med)", "optimizer", "hit rate", "dependent",
		"stall hbm", "stall host", "nvme->host", "host->hbm", "host->nvme", "peak host", "identical")
	for _, m := range r.Modes {
		same := fmt.Sprint(m.ParamsIdentical)
		if len(r.Modes) == 1 || m.Moments != r.Modes[0].Moments || m.Train != r.Modes[0].Train {
			same = "-" // nothing to compare with; other moments, LoRA: not the same run by design
		}
		fmt.Fprintf(&b, "%-14s %9.3fs %9.3fs %9.4f %9d %9.3fs %9.3fs %11s %11s %11s %11s %10s\n", m.Name(), m.MedianStep, m.Optimizer, m.HitRate, m.Dependent,
			m.Stall[shard.HBM], m.Stall[shard.Host], units.FormatBytes(m.LinkBytes[shard.NVMeToHost]), units.FormatBytes(m.LinkBytes[shard.HostToHBM]),
			units.FormatBytes(m.LinkBytes[shard.HostToNVMe]), units.FormatBytes(m.PeakBytes[shard.Host]), same)
	}
	b.WriteString("(bytes per step; stalls summed over the measured steps; identical: params bit-equal to the first mode's after the run;\n" +
		" hit rate: over the accesses a prefetch could serve; dependent: reads that waited for a prefetch issued as soon as\n" +
		" their data was written, e.g. the next forward's read of a param the pipelined update just wrote)\n")
	if r.hasHostOpt() {
		fmt.Fprintf(&b, "%-14s %10s %10s %10s %9s %10s %10s %9s\n", "host optimizer", "step (med)", "/serial", "cpu adam", "exposed", "/adam", "opt waits", "exposed")
		for _, m := range r.Modes {
			if m.Overlap == "" {
				continue
			}
			h := m.HostOpt
			ratio := "-"
			if m.RatioSerial > 0 {
				ratio = fmt.Sprintf("%.3f", m.RatioSerial)
			}
			fmt.Fprintf(&b, "%-14s %9.3fs %10s %9.3fs %8.3fs %10.3f %9.3fs %8.3fs\n", m.Name(), m.MedianStep, ratio,
				h.Adam.Seconds(), h.AdamExposed.Seconds(), h.AdamExposedFraction(), h.IOWait.Seconds(), h.IOExposed.Seconds())
		}
		b.WriteString("(summed over the measured steps and ranks; exposed: cpu adam, or the wait for master/m/v, with the rank's compute stream idle;\n" +
			" on the CPU backend the streams and cpu adam share the cores, so the step time cannot show the gain: the exposed fraction is the figure)\n")
	}
	r.writeResources(&b)
	if r.RatioHostResident > 0 {
		fmt.Fprintf(&b, "ratio host/resident %.3f\n", r.RatioHostResident)
	}
	if r.RatioNVMeHost > 0 {
		fmt.Fprintf(&b, "ratio nvme/host     %.3f\n", r.RatioNVMeHost)
	}
	for _, m := range r.Modes {
		if f := r.momentsBase(m); f != nil {
			nb := func(x *StepModeResult) float64 {
				return float64(x.LinkBytes[shard.NVMeToHost] + x.LinkBytes[shard.HostToNVMe])
			}
			line := fmt.Sprintf("%s / %s: step %.3f", m.Name(), f.Name(), m.MedianStep/f.MedianStep)
			if nb(f) > 0 {
				line += fmt.Sprintf(", nvme bytes per step %.3f (%s vs %s)", nb(&m)/nb(f), units.FormatBytes(int64(nb(&m))), units.FormatBytes(int64(nb(f))))
			}
			fmt.Fprintln(&b, line)
		}
	}
	for _, m := range r.Modes {
		if f := r.loraBase(m); f != nil {
			fmt.Fprintf(&b, "%s / %s: step %.3f, optimizer %.3f, host->hbm bytes per step %.3f, nvme->host %.3f\n", m.Name(), f.Name(), m.MedianStep/f.MedianStep,
				m.Optimizer/max(f.Optimizer, 1e-9), float64(m.LinkBytes[shard.HostToHBM])/max(float64(f.LinkBytes[shard.HostToHBM]), 1),
				float64(m.LinkBytes[shard.NVMeToHost])/max(float64(f.LinkBytes[shard.NVMeToHost]), 1))
		}
	}
	if r.TraceMode != "" {
		t := timeline.TotalOverlap(r.Overlap)
		fmt.Fprintf(&b, "timeline of %s mode in %s: exposed transfer time %v of %v busy on the links (%.3f) over the %d measured steps\n",
			r.TraceMode, o.TracePath, t.Exposed.Round(time.Microsecond), t.TransferBusy.Round(time.Microsecond), t.ExposedFraction, t.Step)
	}
	return b.String()
}

// momentsBase is the fp32-moments run m compares with (the same mode and
// overlap), nil when m is one or there is none.
func (r StepResult) momentsBase(m StepModeResult) *StepModeResult {
	if m.Moments == config.MomentsFP32 || m.Mode == "resident" {
		return nil
	}
	for i, f := range r.Modes {
		if f.Mode == m.Mode && f.Overlap == m.Overlap && f.Train == m.Train && f.Moments == config.MomentsFP32 && f.MedianStep > 0 {
			return &r.Modes[i]
		}
	}
	return nil
}

// loraBase is the run a LoRA run m compares with (the same mode, overlap
// and moments): a QLoRA run's the LoRA run, else the full run, nil when m
// is none or there is none.
func (r StepResult) loraBase(m StepModeResult) *StepModeResult {
	want := map[string]string{"lora": "full", "qlora": "lora"}[m.Train]
	if want == "" {
		return nil
	}
	for i, f := range r.Modes {
		if f.Mode == m.Mode && f.Overlap == m.Overlap && f.Moments == m.Moments && f.Train == want && f.MedianStep > 0 {
			return &r.Modes[i]
		}
	}
	return nil
}

// hasHostOpt says whether a run has the host optimizer (an overlap).
func (r StepResult) hasHostOpt() bool {
	return slices.ContainsFunc(r.Modes, func(m StepModeResult) bool { return m.Overlap != "" })
}

// writeTrace writes e's timeline to f and closes it.
func writeTrace(f *os.File, e *engine.Engine) error {
	if err := e.WriteTrace(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: --trace: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: --trace: %w", err)
	}
	return nil
}

// JSON is the result for --json.
func (r StepResult) JSON() map[string]any {
	out := map[string]any{
		"model": r.Shape.Name, "params": r.Params, "devices": r.Options.Devices, "backend": r.Options.Backend, "batch": r.Options.Batch, "seq": r.Options.Seq,
		"tokens_per_step": r.Tokens, "steps": r.Options.Steps, "warmup": r.Options.Warmup, "block": r.Options.Block, "nvme_optimizer": r.Options.NVMeOptimizer,
		"nvme_path": r.Options.NVMePath, "seconds": r.Seconds,
	}
	if len(r.Reclaimed) > 0 {
		out["reclaimed"] = r.Reclaimed
	}
	if r.RatioNVMeHost > 0 {
		out["ratio_nvme_host"] = r.RatioNVMeHost
	}
	if r.RatioHostResident > 0 {
		out["ratio_host_resident"] = r.RatioHostResident
	}
	if r.TraceMode != "" {
		t := timeline.TotalOverlap(r.Overlap)
		out["trace"] = map[string]any{"path": r.Options.TracePath, "mode": r.TraceMode, "measured_steps": t.Step,
			"exposed_transfer_s": t.Exposed.Seconds(), "transfer_busy_s": t.TransferBusy.Seconds(), "exposed_fraction": t.ExposedFraction}
	}
	var runs []map[string]any
	for _, m := range r.Modes {
		h := m.HostOpt
		runs = append(runs, map[string]any{"mode": m.Mode, "overlap": m.Overlap, "moments": m.Moments, "train": m.Train, "step_s": m.MedianStep, "ratio_serial": m.RatioSerial,
			"bytes_per_step_nvme_to_host": m.LinkBytes[shard.NVMeToHost], "bytes_per_step_host_to_nvme": m.LinkBytes[shard.HostToNVMe], "final_loss": m.FinalLoss,
			"adam_s": h.Adam.Seconds(), "adam_exposed_s": h.AdamExposed.Seconds(), "adam_exposed_fraction": h.AdamExposedFraction(),
			"opt_io_s": h.IOWait.Seconds(), "opt_io_exposed_s": h.IOExposed.Seconds(), "opt_io_exposed_fraction": h.IOExposedFraction(),
			"params_identical": m.ParamsIdentical, "resources": m.Resources.json()})
	}
	out["runs"] = runs
	if r.Disk.ReadBytesPerS > 0 {
		out["disk"] = map[string]any{"path": r.Disk.Path, "read_bytes_per_s": r.Disk.ReadBytesPerS, "write_bytes_per_s": r.Disk.WriteBytesPerS,
			"mixed_bytes_per_s": r.Disk.MixedBytesPerS, "probe_bytes": r.Options.ProbeBytes}
	}
	out["overlaps"] = r.Options.Overlaps
	out["gradient_clipping"] = r.Options.GradientClipping
	out["moments"] = r.Options.Moments
	for _, m := range r.Modes {
		if m.Overlap != "" && m.Overlap != r.Options.Overlaps[0] || m.Moments != r.Options.Moments[0] && m.Mode != "resident" {
			continue // the keys per mode are the first overlap's and moments'; "runs" has them all
		}
		out["step_s_"+m.Mode] = m.MedianStep
		out[m.Mode] = map[string]any{
			"step_s": m.Steps, "step_s_median": m.MedianStep, "optimizer_s_median": m.Optimizer, "hit_rate": m.HitRate,
			"accesses": m.Accesses, "hits": m.Hits, "dependent": m.Dependent, "late": m.counts.Late, "misses": m.counts.Misses,
			"room_waits":  m.counts.RoomWaits,
			"stall_hbm_s": m.Stall[shard.HBM], "stall_host_s": m.Stall[shard.Host],
			"bytes_per_step_nvme_to_host": m.LinkBytes[shard.NVMeToHost], "bytes_per_step_host_to_hbm": m.LinkBytes[shard.HostToHBM],
			"bytes_per_step_hbm_to_host": m.LinkBytes[shard.HBMToHost], "bytes_per_step_host_to_nvme": m.LinkBytes[shard.HostToNVMe],
			"peak_hbm_bytes": m.PeakBytes[shard.HBM], "peak_host_bytes": m.PeakBytes[shard.Host], "peak_nvme_bytes": m.PeakBytes[shard.NVMe],
			"budget_hbm_bytes": m.BudgetBytes[shard.HBM], "budget_host_bytes": m.BudgetBytes[shard.Host], "budget_nvme_bytes": m.BudgetBytes[shard.NVMe],
			"device_peak_bytes": m.DevicePeakBytes, "final_loss": m.FinalLoss, "params_identical": m.ParamsIdentical,
		}
		if t := m.Summary.Tier; t != nil {
			out[m.Mode].(map[string]any)["pinned_relocations"] = t.PinnedRelocations // the whole run, warm-up included
		}
	}
	return out
}
