package plan

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/shard"
)

// The measurements behind `strata plan`: each rate the predictor
// multiplies by, measured here on the machine, with the components a run
// uses (the engine, cpuadam, the NVMe engine). `strata bench step` probes
// the drive through ProbeDisk too.

// ProbeRates measures the host↔device copy rate of the backend's first
// device (64 MiB each way, the median of 5) and cpuadam's step with
// threads threads (0: every core; bf16 gradients and bf16 new params, as
// the host optimizer runs them; 8M params, the median of 5) into p.
func ProbeRates(ctx context.Context, p *Profile, backendName string, hbmBytes int64, threads int) error {
	devs, err := backend.Open(backendName, 1, hbmBytes, true)
	if err != nil {
		return err
	}
	defer devs.Close()
	d := devs.Devs[0]
	const n = 64 << 20
	buf, err := d.Alloc(n/2, gpu.BF16, gpu.Tag{Kind: gpu.Workspace, Purpose: "probe"})
	if err != nil {
		return fmt.Errorf("plan: probe copies: %w", err)
	}
	defer d.Free(buf)
	host := make([]byte, n)
	s := d.DefaultStream()
	var secs []float64
	for range 5 {
		t0 := time.Now()
		d.CopyHostToDevice(s, buf, 0, host)
		d.CopyDeviceToHost(s, host, buf, 0)
		if err := s.Synchronize(); err != nil {
			return fmt.Errorf("plan: probe copies: %w", err)
		}
		secs = append(secs, time.Since(t0).Seconds())
	}
	p.CopyBytesPerS = 2 * n / units.Median(secs)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("plan: probe: %w", context.Cause(ctx))
	}

	opt, err := cpuadam.New(cpuadam.Options{Threads: threads})
	if err != nil {
		return fmt.Errorf("plan: probe cpu adam: %w", err)
	}
	defer opt.Close()
	const params = 8 << 20
	param, m, v := make([]float32, params), make([]float32, params), make([]float32, params)
	grad, out := make([]uint16, params), make([]uint16, params)
	for i := range grad {
		grad[i] = 0x3c00 // 2^-7 in bf16
	}
	ap := cpuadam.Params{LR: 1e-4, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, GradScale: 1, Mode: cpuadam.AdamW}
	secs = secs[:0]
	for r := range 6 {
		ap.Step = int64(r + 1)
		t0 := time.Now()
		opt.StepBF16(ap, param, grad, m, v, out)
		if r > 0 { // the first touches the pages
			secs = append(secs, time.Since(t0).Seconds())
		}
	}
	p.AdamParamsPerS, p.AdamThreads = params/units.Median(secs), opt.Options().Threads

	// The other optimizer states strata.optimizer_state names: moments
	// fp32, bf16 or int8, the master fp32 or the bf16 params (out) plus a
	// remainder.
	for _, mo := range []cpuadam.Moments{cpuadam.MomentsF32, cpuadam.MomentsBF16, cpuadam.MomentsInt8} {
		for _, rem := range []bool{false, true} {
			if mo == cpuadam.MomentsF32 && !rem {
				continue // AdamParamsPerS
			}
			sh := cpuadam.Shard{Grad16: grad, Out: out, M: mo.View(params, make([]byte, mo.Bytes(params)), false),
				V: mo.View(params, make([]byte, mo.Bytes(params)), true)}
			sh.M.Encode(m)
			sh.V.Encode(v)
			master := config.MasterFP32
			if rem {
				master = config.MasterBF16Remainder
				bf16.FromFloat32s(out, param)
				sh.Rem = cpuadam.RemainderView(params, make([]byte, dtype.Rem16.Bytes(params)))
				sh.Rem.Split(param, out)
			} else {
				sh.Param = param
			}
			secs = secs[:0]
			for r := range 6 {
				ap.Step = int64(r + 1)
				t0 := time.Now()
				opt.Step(ap, sh)
				if r > 0 {
					secs = append(secs, time.Since(t0).Seconds())
				}
			}
			p.SetAdamRate(AdamState{Moments: mo.String(), Master: master, ParamsPerS: params / units.Median(secs)})
		}
	}
	return probeDecodes(ctx, p, d)
}

// probeDecodes measures the device's decoding of each coded base format
// (gpu.Ops.Dequantize to bf16, 16M params, the median of 5) into p.
func probeDecodes(ctx context.Context, p *Profile, d gpu.Device) error {
	const n = 16 << 20
	dst, err := d.Alloc(n, gpu.BF16, gpu.Tag{Kind: gpu.Workspace, Purpose: "probe"})
	if err != nil {
		return fmt.Errorf("plan: probe decoding: %w", err)
	}
	defer d.Free(dst)
	s := d.DefaultStream()
	for _, f := range config.BaseDTypes[1:] {
		dt := estimate.BaseDType(f)
		src, err := d.Alloc(int(dt.Bytes(n)), gpu.U8, gpu.Tag{Kind: gpu.Workspace, Purpose: "probe"})
		if err != nil {
			return fmt.Errorf("plan: probe decoding: %w", err)
		}
		var secs []float64
		for range 5 {
			t0 := time.Now()
			d.Ops().Dequantize(s, dt, src, dst, n)
			if err := s.Synchronize(); err != nil {
				d.Free(src)
				return fmt.Errorf("plan: probe decoding %s: %w", f, err)
			}
			secs = append(secs, time.Since(t0).Seconds())
		}
		d.Free(src)
		p.SetDecodeRate(Decode{Format: f, ParamsPerS: n / units.Median(secs)})
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("plan: probe: %w", context.Cause(ctx))
		}
	}
	return nil
}

// NVMeRoom is the free space under dir for a run's swap files, once dir
// has proved a writable directory (a file created in it and removed).
func NVMeRoom(dir string) (int64, error) {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return 0, fmt.Errorf("%s is not a directory", dir)
	}
	f, err := os.CreateTemp(dir, ".strata-plan-*")
	if err != nil {
		return 0, fmt.Errorf("%s is not writable: %v", dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nvme.FreeBytes(dir)
}

// ProbeCompute measures a step of in.Model in placement c (resident, stage
// 0, when the model fits a device: the first placement that fits without
// NVMe) on the backend's devices: after 2 warm-up steps, the median over 6
// of the step without its optimizer phase (in an NVMe placement, where the
// step waits for the disk, the compute stream's busy time), and of the
// phase.
func ProbeCompute(ctx context.Context, c Config, in Inputs, backendName string) (Compute, error) {
	runtime.GC() // what the other probes left is not this step's
	times, err := runSteps(ctx, ConfigJSON(c, in), backendName, in, 2, 6)
	if err != nil {
		return Compute{}, err
	}
	var fb, ad []float64
	for _, st := range times {
		d := st.Duration - st.OptimizerTime
		if (c.Optimizer == shard.NVMe || c.Params == shard.NVMe) && st.ComputeBusy > 0 {
			// Only NVMe placements fit: the step waits for the disk, so
			// the compute stream's busy time is the devices' work.
			d = st.ComputeBusy
		}
		fb = append(fb, d.Seconds())
		ad = append(ad, st.OptimizerTime.Seconds())
	}
	cm := Compute{Model: in.Model, Devices: in.Devices, Batch: in.Batch, Seq: in.Seq, Params: in.Shape.ParamCount(),
		FwdBwdSeconds: units.Median(fb), DeviceAdamSeconds: units.Median(ad)}
	if c.Optimizer == shard.Host && c.Params == shard.HBM {
		// The ZeRO-Offload step ProbeOffload would measure again.
		var step []float64
		for _, st := range times {
			step = append(step, st.Duration.Seconds())
		}
		cm.OffloadStepSeconds, cm.OffloadStage = units.Median(step), c.Stage
	}
	return cm, nil
}

// ProbeCheckpoint measures the step of in.Model in placement c with
// activation checkpointing (the compute probe's placement, checkpointed),
// as ProbeCompute does, into cm.CheckpointFwdBwdSeconds.
func ProbeCheckpoint(ctx context.Context, cm *Compute, c Config, in Inputs, backendName string) error {
	ck, err := ProbeCompute(ctx, c, in, backendName)
	if err != nil {
		return err
	}
	cm.CheckpointFwdBwdSeconds = ck.FwdBwdSeconds
	return nil
}

// ProbeOffload measures the step of in.Model in the ZeRO-Offload
// placement off (the optimizer state in host RAM): 2 warm-up steps, the
// median of 6, into cm.
func ProbeOffload(ctx context.Context, cm *Compute, off Config, in Inputs, backendName string) error {
	runtime.GC()
	s, err := TimeConfig(ctx, off, in, backendName, 2, 6)
	if err != nil {
		return err
	}
	cm.OffloadStepSeconds, cm.OffloadStage = units.Median(s), off.Stage
	return nil
}

// ProbeNVMe measures how much of the drive's probed rates (d) the
// engine's moves get in placement pr of in (one with state on NVMe): 2
// warm-up steps, then over 2 steps the rates d predicts for the NVMe
// bytes the steps moved, against the time the engine's NVMe links were
// busy (the union of each link's moves: TierStats.LinkActive; reads and
// writes at once counted once, as the longer link), into cm. A model
// whose state the tier store keeps in host RAM moves nothing: no
// efficiency (0), the probed rates stand.
//
// It also records what the tier store kept in host RAM between those
// steps (nvmeKept), as the kept bytes of pr's state precision (setKept);
// and, when narrow is not nil (the job's narrow-state NVMe placement,
// pr's state being fp32), the same of 2 steps of it after 2 warm-up
// steps. The store keeps far more of a narrow state,
// a third the size in the same staging room.
func ProbeNVMe(ctx context.Context, cm *Compute, pr Prediction, narrow *Prediction, in Inputs, backendName string, d Disk) error {
	read, write, busy, err := nvmeSteps(ctx, pr, in, backendName)
	if err != nil {
		return err
	}
	cm.NVMeEfficiency, cm.NVMePath = 0, in.NVMePath
	if read+write > 0 && busy > 0 {
		cm.NVMeEfficiency = d.seconds(read, write) / busy
	} // else the state stayed in host RAM (the tier store's host budget holds it): no rate to correct
	cm.NVMeKeptReadBytes, cm.NVMeKeptWriteBytes, cm.NarrowKeptReadBytes, cm.NarrowKeptWriteBytes = 0, 0, 0, 0
	if err := setKept(cm, pr, in, read, write); err != nil || narrow == nil {
		return err
	}
	if read, write, _, err = nvmeSteps(ctx, *narrow, in, backendName); err != nil {
		return err
	}
	return setKept(cm, *narrow, in, read, write)
}

// setKept sets cm's kept bytes of pr's state precision (NarrowKept* for
// a narrow state, else NVMeKept*) from pr's measured reads and writes.
func setKept(cm *Compute, pr Prediction, in Inputs, read, write float64) error {
	r, w, err := nvmeKept(pr, in, read, write)
	if pr.Narrow() {
		cm.NarrowKeptReadBytes, cm.NarrowKeptWriteBytes = r, w
	} else {
		cm.NVMeKeptReadBytes, cm.NVMeKeptWriteBytes = r, w
	}
	return err
}

// nvmeSteps runs placement pr of in for 2 warm-up steps and 2 more, and
// returns the bytes those 2 read from and wrote to NVMe, a step each,
// and the seconds a step the busier NVMe link was active.
func nvmeSteps(ctx context.Context, pr Prediction, in Inputs, backendName string) (read, write, busy float64, err error) {
	runtime.GC()
	times, err := runSteps(ctx, ConfigJSON(pr.Config, in), backendName, in, 2, 2)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%s: %w", pr.Name, err)
	}
	var readBusy, writeBusy time.Duration
	for _, st := range times {
		if st.Tier == nil {
			return 0, 0, 0, fmt.Errorf("plan: probe NVMe: %s: the step reports no tier store", pr.Name)
		}
		read += float64(st.Tier.LinkBytes[shard.NVMeToHost])
		write += float64(st.Tier.LinkBytes[shard.HostToNVMe])
		readBusy += st.Tier.LinkActive[shard.NVMeToHost]
		writeBusy += st.Tier.LinkActive[shard.HostToNVMe]
	}
	n := float64(len(times))
	return read / n, write / n, max(readBusy, writeBusy).Seconds() / n, nil
}

// nvmeKept is what the tier store kept in host RAM between steps of pr
// that read and wrote read and write bytes a step on NVMe: the bytes
// diskBytes counts with nothing kept, less those.
func nvmeKept(pr Prediction, in Inputs, read, write float64) (keptRead, keptWrite float64, err error) {
	w, err := workOf(in)
	if err != nil {
		return 0, 0, err
	}
	updRead, updWrite, passRead := diskBytes(&pr, in, w)
	return max(updRead+passRead-read, 0), max(updWrite-write, 0), nil
}

// TimeConfig runs placement c of in for warmup steps, then steps more,
// and returns those steps' times in seconds (`strata plan --check`).
func TimeConfig(ctx context.Context, c Config, in Inputs, backendName string, warmup, steps int) ([]float64, error) {
	runtime.GC() // the engines before it (their devices are Go memory on the CPU backend) are not its cost
	times, err := runSteps(ctx, ConfigJSON(c, in), backendName, in, warmup, steps)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name, err)
	}
	var secs []float64
	for _, st := range times {
		secs = append(secs, st.Duration.Seconds())
	}
	return secs, nil
}

// runSteps builds an engine of the config js and returns the stats of
// steps steps after warmup; it stops between steps when ctx is done.
func runSteps(ctx context.Context, js, backendName string, in Inputs, warmup, steps int) ([]report.StepStats, error) {
	lookup := func(name string) (config.Shape, error) {
		if name == in.Model {
			return config.Shape(in.Shape), nil
		}
		return model.LookupConfigShape(name)
	}
	cfg, err := config.Parse([]byte(js), "json", config.Options{LookupShape: lookup})
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	devs, err := backend.Open(backendName, in.Devices, in.HBMBytes, cfg.Strata.Deterministic)
	if err != nil {
		return nil, err
	}
	defer devs.Close()
	e, err := engine.New(cfg, devs.Devs, devs.Comms, engine.Options{HostRegistrar: devs.Registrar, Collectives: devs.Collectives})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	var out []report.StepStats
	for i := range warmup + steps {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("plan: stopped after %d steps: %w", i, context.Cause(ctx))
		}
		st, err := e.Step()
		if err != nil {
			return nil, err
		}
		if i >= warmup {
			out = append(out, st)
		}
	}
	return out, nil
}
