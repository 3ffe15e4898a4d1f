package config

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/lossscale"
)

// utf8BOM is the byte order mark some editors write at the start of UTF-8
// files; JSON (RFC 8259) lets a parser ignore it.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// Parse reads a DeepSpeed-style JSON config. file names the source in
// messages ("" for none). Every problem is reported with its line, column
// and JSON path; when there are several, the error is an Errors. A leading
// UTF-8 byte order mark is skipped (it is invisible in editors, so columns
// count from after it).
func Parse(data []byte, file string, opts Options) (*Config, error) {
	data = bytes.TrimPrefix(data, utf8BOM)
	root, err := parseTree(data, file)
	if err != nil {
		return nil, err
	}
	c := &Config{}
	c.setDefaults()
	d := &decoder{file: file, data: data, pos: map[string]int{}}
	r := d.newSection(root, "")

	batchKey(r, "train_batch_size", &c.batch.train)
	batchKey(r, "train_micro_batch_size_per_gpu", &c.batch.micro)
	batchKey(r, "gradient_accumulation_steps", &c.batch.accum)

	c.decodeOptimizer(r.sub("optimizer"))
	c.decodeScheduler(r.sub("scheduler"))
	c.decodePrecision(r)
	if !r.autoKey("gradient_clipping") {
		r.floatKey("gradient_clipping", &c.GradientClipping, nonNegative)
	}
	r.intKey("steps_per_print", &c.StepsPerPrint, atLeast(1))
	r.boolKey("wall_clock_breakdown", &c.WallClockBreakdown)
	if r.has("wall_clock_breakdown") {
		r.notice("wall_clock_breakdown", "every run reports per-step times in its JSONL log")
	}
	c.decodeZeRO(r.sub("zero_optimization"))
	c.decodeAIO(r.sub("aio"))
	c.decodeActivations(r)
	c.decodeStrata(r.sub("strata"), opts)
	c.decodeMonitors(r)
	c.fillAuto(d, opts.Auto)
	for _, k := range []string{"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "prescale_gradients",
		"gradient_predivide_factor", "communication_data_type", "memory_breakdown", "dump_state",
		"flops_profiler", "comms_logger", "data_types"} {
		r.ignore(k, "Strata has no such feature")
	}
	d.finish()
	c.file = file
	if opts.Devices > 0 {
		c.Strata.Devices, c.Strata.devicesFrom = opts.Devices, "--devices"
	}
	if len(d.errs) == 0 {
		c.crossChecks(d)
	}
	if len(d.errs) == 0 {
		if err := c.resolveBatch(); err != nil {
			first := "train_batch_size"
			for _, k := range []string{"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"} {
				if _, ok := d.pos[k]; ok {
					first = k
					break
				}
			}
			off, ok := d.pos[first]
			if !ok {
				off = -1
			}
			d.errAt(off, "", "%s (%s)", err.Error(), c.batchSources())
		} else {
			c.chooseBatch(d)
		}
	}
	if len(d.errs) > 0 {
		sortErrors(d.errs)
		if len(d.errs) == 1 {
			return nil, d.errs[0]
		}
		return nil, Errors(d.errs)
	}
	c.ignored = d.ignored
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// batchKey reads one of the three batch keys; "auto" means "derive it".
func batchKey(r *section, key string, dst *int) {
	if r.autoKey(key) {
		return
	}
	r.intKey(key, dst, atLeast(1))
}

func nonNegative(v float64) string {
	if v < 0 {
		return fmt.Sprintf("%v is negative", v)
	}
	return ""
}

func atLeast(lo int64) func(int64) string {
	return func(v int64) string {
		if v < lo {
			return fmt.Sprintf("%d must be at least %d", v, lo)
		}
		return ""
	}
}

func (c *Config) decodeOptimizer(s *section) {
	if n := s.get("type"); n != nil {
		if n.kind != kindString {
			s.d.errAt(n.offset, "optimizer.type", "want a string, got %s", describe(n))
		} else {
			switch strings.ToLower(n.text) { // DeepSpeed compares lower-cased names
			case "adam":
				c.Optimizer.Type = "Adam"
			case "adamw":
				c.Optimizer.Type = "AdamW"
			default:
				s.d.errAt(n.offset, "optimizer.type", "%q is not supported: Strata implements \"Adam\" and \"AdamW\"", n.text)
			}
		}
	} else if s.n != nil {
		s.d.errAt(s.n.offset, "optimizer", `missing "type" ("Adam" or "AdamW")`)
	}
	p := s.sub("params")
	a := &c.Optimizer.Params
	if !p.autoKey("lr") {
		p.floatKey("lr", &a.LR, nonNegative)
	}
	if n := p.get("betas"); n != nil && !p.autoKey("betas") {
		if n.kind != kindArray || len(n.elems) != 2 {
			p.d.errAt(n.offset, "optimizer.params.betas", "want a list of two numbers [beta1, beta2], got %s", describe(n))
		} else {
			for i, e := range n.elems {
				path := fmt.Sprintf("optimizer.params.betas[%d]", i)
				if e.kind != kindNumber {
					p.d.errAt(e.offset, path, "want a number, got %s", describe(e))
					continue
				}
				v, err := strconv.ParseFloat(e.text, 64)
				if err != nil || !(v >= 0 && v < 1) {
					p.d.errAt(e.offset, path, "%s is not in [0, 1)", e.text)
					continue
				}
				a.Betas[i] = v
			}
		}
	}
	if !p.autoKey("eps") {
		p.floatKey("eps", &a.Eps, func(v float64) string {
			if !(v > 0) {
				return fmt.Sprintf("%v must be > 0", v)
			}
			return ""
		})
	}
	if !p.autoKey("weight_decay") {
		p.floatKey("weight_decay", &a.WeightDecay, nonNegative)
	}
	p.boolKey("adam_w_mode", &a.AdamWMode)
	if c.Optimizer.Type == "AdamW" && p.has("adam_w_mode") && !a.AdamWMode {
		p.d.errPath("optimizer.params.adam_w_mode", `false contradicts type "AdamW" (DeepSpeed would use AdamW anyway); use type "Adam" for L2-style weight decay`)
	}
	if c.Optimizer.Type == "AdamW" {
		a.AdamWMode = true
	}
	var bias bool = true
	p.boolKey("bias_correction", &bias)
	if !bias {
		p.d.errPath("optimizer.params.bias_correction", "false is not supported: Strata's Adam always corrects the bias")
	}
	var amsgrad bool
	p.boolKey("amsgrad", &amsgrad)
	if amsgrad {
		p.d.errPath("optimizer.params.amsgrad", "true is not supported")
	}
	p.ignore("torch_adam", "Strata uses its own CPU and device Adam")
}

func (c *Config) decodeScheduler(s *section) {
	sp := &c.Scheduler.Params
	s.stringKey("type", &c.Scheduler.Type, "WarmupLR", "WarmupDecayLR")
	if s.n != nil && !s.has("type") {
		s.d.errAt(s.n.offset, "scheduler", `missing "type" ("WarmupLR" or "WarmupDecayLR")`)
	}
	p := s.sub("params")
	if !p.autoKey("warmup_min_lr") {
		p.floatKey("warmup_min_lr", &sp.WarmupMinLR, nonNegative)
	}
	if !p.autoKey("warmup_max_lr") {
		p.floatKey("warmup_max_lr", &sp.WarmupMaxLR, nonNegative)
	}
	if !p.autoKey("warmup_num_steps") {
		p.intKey("warmup_num_steps", &sp.WarmupNumSteps, atLeast(0))
	}
	p.stringKey("warmup_type", &sp.WarmupType, "log", "linear")
	if !p.autoKey("total_num_steps") {
		p.intKey("total_num_steps", &sp.TotalNumSteps, atLeast(1))
	}
	p.ignore("last_batch_iteration", "a run starts at step 0 (resuming restores the step from the checkpoint)")
	switch {
	case c.Scheduler.Type == "WarmupDecayLR" && !p.has("total_num_steps"):
		off := -1
		if p.n != nil {
			off = p.n.offset
		} else if s.n != nil {
			off = s.n.offset
		}
		s.d.errAt(off, "scheduler.params", "WarmupDecayLR needs total_num_steps")
	case c.Scheduler.Type == "WarmupLR" && p.has("total_num_steps"):
		p.d.errPath("scheduler.params.total_num_steps", "applies to WarmupDecayLR only; WarmupLR stays at warmup_max_lr")
	}
}

func (c *Config) decodePrecision(r *section) {
	// fp16 first: whether it is on decides what bf16 "enabled": false means.
	f := r.sub("fp16")
	fp := &c.FP16
	var fpOn *node // fp16.enabled written true
	if n := f.get("enabled"); n != nil {
		switch {
		case f.autoKey("enabled"):
		case n.kind != kindBool:
			f.d.errAt(n.offset, "fp16.enabled", "want true or false, got %s", describe(n))
		case n.b:
			fp.Enabled, fpOn = true, n
		}
	}
	f.floatKey("loss_scale", &fp.LossScale, func(v float64) string {
		if v < 0 {
			return "want 0 (dynamic scaling) or a positive static scale"
		}
		if v > 0 && (v < lossscale.MinStatic || v > lossscale.MaxStatic) {
			return fmt.Sprintf("%g: %s", v, staticScaleRange)
		}
		return ""
	})
	f.intKey("initial_scale_power", &fp.InitialScalePower, func(v int64) string {
		if v < 0 || v > 100 {
			return fmt.Sprintf("%d: want 0 to 100 (the scale starts at 2^power)", v)
		}
		return ""
	})
	f.intKey("loss_scale_window", &fp.LossScaleWindow, func(v int64) string {
		if v < 1 {
			return fmt.Sprintf("%d: want at least 1 step", v)
		}
		return ""
	})
	f.intKey("hysteresis", &fp.Hysteresis, func(v int64) string {
		if v < 1 {
			return fmt.Sprintf("%d: want at least 1 (the overflows tolerated before the scale halves)", v)
		}
		return ""
	})
	f.boolKey("consecutive_hysteresis", &fp.ConsecutiveHysteresis)
	f.floatKey("min_loss_scale", &fp.MinLossScale, func(v float64) string {
		if v <= 0 {
			return "want a positive scale"
		}
		return ""
	})
	if msg := fp.minScaleAbove(f.has("min_loss_scale")); msg != "" {
		f.d.errPath("fp16.min_loss_scale", "%s", msg) // only a written min_loss_scale can be above 2^0 or a static scale
	}
	f.ignore("auto_cast", "the model's inputs are token ids; the device params and activations are fp16 when fp16 is enabled")
	if n := f.get("fp16_master_weights_and_grads"); n != nil && n.kind == kindBool && n.b {
		f.d.errAt(n.offset, "fp16.fp16_master_weights_and_grads", "true is not supported: Strata keeps fp32 master weights on the host; remove the key")
	}

	b := r.sub("bf16")
	if n := b.get("enabled"); n != nil {
		switch {
		case b.autoKey("enabled"):
		case n.kind != kindBool:
			b.d.errAt(n.offset, "bf16.enabled", "want true or false, got %s", describe(n))
		case n.b && fpOn != nil:
			b.d.errAt(n.offset, "bf16.enabled", "true with fp16.enabled true: enable one of them (DeepSpeed refuses both too)")
		case !n.b && !fp.Enabled && !isAuto(f.get("enabled")):
			b.d.errAt(n.offset, "bf16.enabled", `false is not supported without fp16: Strata trains in bf16 or fp16 mixed precision (fp32 master weights and moments); set "fp16": {"enabled": true} for fp16`)
		case !n.b:
			c.BF16.Enabled = false
		}
	}
	if fp.Enabled {
		c.BF16.Enabled = false
	}
	b.ignore("immediate_grad_update", "gradients are reduced into their shard as each chunk finishes")
	// DeepSpeed's bf16 optimizer state: Adam's moments in bf16 (strata.optimizer_state.moments "bf16").
	b.boolKey("bf16_optimizer_states", &c.BF16.OptimizerStates)
	if n := b.get("bf16_master_weights_and_grads"); n != nil && n.kind == kindBool && n.b {
		b.d.errAt(n.offset, "bf16.bf16_master_weights_and_grads", "true is not supported: Strata keeps fp32 master weights (bf16 ones lose every update under 2^-8 of the weight); remove the key")
	} else {
		b.boolKey("bf16_master_weights_and_grads", new(bool))
	}
	if b.n == nil && f.n == nil {
		r.d.ignored = append(r.d.ignored, "bf16 is not set: Strata trains in bf16 mixed precision (DeepSpeed would train in fp32)")
	}
	if !fp.Enabled && f.n != nil { // false, or "auto" (which is false)
		r.notice("fp16", "fp16 is not enabled: Strata trains in bf16 unless fp16.enabled is true")
	}
}

var stage3Why = "the prefetch planner sizes prefetch from the recorded trace and the byte budgets"

func (c *Config) decodeZeRO(s *section) {
	z := &c.ZeRO
	s.intKey("stage", &z.Stage, func(v int64) string {
		if v < 0 || v > 3 {
			return fmt.Sprintf("%d is not 0, 1, 2 or 3", v)
		}
		return ""
	})
	s.boolKey("contiguous_gradients", &z.ContiguousGradients)
	if s.has("contiguous_gradients") {
		s.notice("contiguous_gradients", "gradients always live in contiguous chunk buffers")
	}
	s.boolKey("overlap_comm", &z.OverlapComm)
	if s.has("overlap_comm") {
		s.notice("overlap_comm", "communication always overlaps compute, chunk by chunk")
	}
	autoCount := func(key string, dst *int64, lo int64) {
		if isAuto(s.get(key)) {
			z.auto = append(z.auto, key)
			return
		}
		s.int64Key(key, dst, atLeast(lo))
	}
	autoCount("reduce_bucket_size", &z.ReduceBucketSize, 1)
	s.int64Key("allgather_bucket_size", &z.AllgatherBucketSize, atLeast(1))
	if s.has("allgather_bucket_size") {
		s.notice("allgather_bucket_size", "AllGather moves whole chunks")
	}
	s.boolKey("reduce_scatter", &z.ReduceScatter)
	if s.has("reduce_scatter") {
		s.notice("reduce_scatter", "gradients are always reduced with ReduceScatter at stage 1-3")
	}
	autoCount("stage3_param_persistence_threshold", &z.Stage3ParamPersistenceThreshold, 0)
	autoCount("stage3_prefetch_bucket_size", &z.Stage3PrefetchBucketSize, 0)
	if s.has("stage3_prefetch_bucket_size") {
		s.notice("stage3_prefetch_bucket_size", stage3Why)
	}
	for _, k := range []struct {
		key string
		dst *int64
	}{{"stage3_max_live_parameters", &z.Stage3MaxLiveParameters}, {"stage3_max_reuse_distance", &z.Stage3MaxReuseDistance}} {
		s.int64Key(k.key, k.dst, atLeast(0))
		if s.has(k.key) {
			s.notice(k.key, stage3Why)
		}
	}
	s.boolKey("stage3_gather_16bit_weights_on_model_save", &z.Stage3Gather16bitWeightsOnModelSave)
	if s.has("stage3_gather_16bit_weights_on_model_save") {
		s.notice("stage3_gather_16bit_weights_on_model_save", "checkpoints are sharded; export gathers them")
	}
	s.int64Key("sub_group_size", &z.SubGroupSize, atLeast(1))
	if s.has("sub_group_size") {
		s.notice("sub_group_size", "the optimizer steps one chunk shard at a time")
	}
	for _, k := range []string{"round_robin_gradients", "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
		"stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save", "memory_efficient_linear",
		"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients", "mics_shard_size", "mics_hierarchical_params_gather"} {
		s.ignore(k, "Strata has no such feature")
	}
	if n := s.get("cpu_offload"); n != nil {
		s.d.errAt(n.offset, "zero_optimization.cpu_offload", `is DeepSpeed's old spelling: write "offload_optimizer": {"device": "cpu"}`)
	}

	op := s.sub("offload_param")
	op.stringKey("device", &z.OffloadParam.Device, DeviceNone, DeviceCPU, DeviceNVMe)
	op.pathsKey("nvme_path", &z.OffloadParam.NVMePath)
	op.boolKey("pin_memory", &z.OffloadParam.PinMemory)
	if op.has("pin_memory") {
		op.notice("pin_memory", "host buffers are always pinned")
	}
	op.intKey("buffer_count", &z.OffloadParam.BufferCount, atLeast(1))
	op.bytesKey("buffer_size", &z.OffloadParam.BufferSize, nil)
	op.int64Key("max_in_cpu", &z.OffloadParam.MaxInCPU, atLeast(0))
	for _, k := range []string{"buffer_count", "buffer_size", "max_in_cpu"} {
		if op.has(k) {
			op.notice(k, "buffers are derived from the model and the plan; strata.host_budget bounds host RAM")
		}
	}

	oo := s.sub("offload_optimizer")
	oo.stringKey("device", &z.OffloadOptimizer.Device, DeviceNone, DeviceCPU, DeviceNVMe)
	oo.pathsKey("nvme_path", &z.OffloadOptimizer.NVMePath)
	oo.boolKey("pin_memory", &z.OffloadOptimizer.PinMemory)
	if oo.has("pin_memory") {
		oo.notice("pin_memory", "host buffers are always pinned")
	}
	oo.intKey("buffer_count", &z.OffloadOptimizer.BufferCount, atLeast(1))
	if oo.has("buffer_count") {
		oo.notice("buffer_count", "buffers are derived from the model and the plan")
	}
	for _, k := range []struct {
		key string
		dst *bool
		why string
	}{
		{"fast_init", &z.OffloadOptimizer.FastInit, "optimizer state is initialised in place"},
		{"pipeline_read", &z.OffloadOptimizer.PipelineRead, "the optimizer pipeline always reads ahead"},
		{"pipeline_write", &z.OffloadOptimizer.PipelineWrite, "the optimizer pipeline always writes behind"},
	} {
		oo.boolKey(k.key, k.dst)
		if oo.has(k.key) {
			oo.notice(k.key, k.why)
		}
	}
	oo.floatKey("ratio", &z.OffloadOptimizer.Ratio, func(v float64) string {
		if !(v > 0 && v <= 1) {
			return fmt.Sprintf("%v is not in (0, 1]", v)
		}
		return ""
	})
	if oo.has("ratio") {
		oo.notice("ratio", "the whole optimizer state is offloaded; strata.host_budget splits host RAM and NVMe")
	}
}

// The aio values the NVMe engine takes: a larger one would be clamped
// (the engine's request table holds at most maxAIORequests) or cost
// swap space for nothing (each swap file keeps a few block_size units
// spare), so the config refuses it.
const (
	maxAIOBlockSize   = 64 << 20
	maxAIOQueueDepth  = 4096
	maxAIOThreadCount = 64
	maxAIORequests    = 4096 // queue_depth × thread_count: nvme.Options.QueueDepth's most
)

// inRange is a check of a whole number from lo to hi.
func inRange(lo, hi int64) func(int64) string {
	return func(v int64) string {
		if v < lo || v > hi {
			return fmt.Sprintf("%d is out of range: want %d to %d", v, lo, hi)
		}
		return ""
	}
}

func (c *Config) decodeAIO(s *section) {
	a := &c.AIO
	s.bytesKey("block_size", &a.BlockSize, func(v int64) string {
		if v <= 0 || v%4096 != 0 {
			return fmt.Sprintf("%d is not a positive multiple of 4096 (O_DIRECT alignment)", v)
		}
		if v > maxAIOBlockSize {
			return fmt.Sprintf("%d (%s) is out of range: want 4096 to %d (%s), a multiple of 4096", v, units.FormatBytes(v), maxAIOBlockSize, units.FormatBytes(maxAIOBlockSize))
		}
		return ""
	})
	s.intKey("queue_depth", &a.QueueDepth, inRange(1, maxAIOQueueDepth))
	// The thread knob has two names; both may be written if they agree.
	tc, iop := 0, 0
	s.intKey("thread_count", &tc, inRange(1, maxAIOThreadCount))
	s.intKey("intra_op_parallelism", &iop, inRange(1, maxAIOThreadCount))
	switch {
	case tc > 0 && iop > 0 && tc != iop:
		s.d.errPath("aio.intra_op_parallelism", "%d disagrees with aio.thread_count %d (they name the same knob)", iop, tc)
	case tc > 0:
		a.ThreadCount = tc
	case iop > 0:
		a.ThreadCount = iop
	}
	if a.QueueDepth <= maxAIOQueueDepth && a.ThreadCount <= maxAIOThreadCount && a.QueueDepth*a.ThreadCount > maxAIORequests {
		key := "aio.thread_count"
		switch {
		case tc == 0 && iop == 0:
			key = "aio.queue_depth"
		case tc == 0:
			key = "aio.intra_op_parallelism"
		}
		s.d.errPath(key, "queue_depth %d × thread_count %d = %d requests in flight is more than the NVMe engine's %d: lower either",
			a.QueueDepth, a.ThreadCount, a.QueueDepth*a.ThreadCount, maxAIORequests)
	}
	for _, k := range []struct {
		key string
		dst *bool
		why string
	}{
		{"single_submit", &a.SingleSubmit, "io_uring submits in batches"},
		{"overlap_events", &a.OverlapEvents, "completions are always reaped while new requests are queued"},
		{"use_gds", &a.UseGDS, "GPUDirect Storage is not supported; NVMe reads land in pinned host memory"},
	} {
		s.boolKey(k.key, k.dst)
		if s.has(k.key) {
			s.notice(k.key, k.why)
		}
	}
}

func (c *Config) decodeStrata(s *section, opts Options) {
	st := &c.Strata
	if n := s.get("model"); n != nil {
		switch n.kind {
		case kindString:
			st.Model = ModelSpec{Name: n.text}
			if opts.LookupShape != nil {
				shape, err := opts.LookupShape(n.text)
				if err != nil {
					s.d.errAt(n.offset, "strata.model", "%v", err)
				} else {
					st.Model.Shape = &shape
				}
			}
		case kindObject:
			st.Model = ModelSpec{Shape: decodeShape(s.d.newSection(n, "strata.model"))}
		default:
			s.d.errAt(n.offset, "strata.model", `want a shape name such as "gpt2" or an object {"n_layer", "n_embd", "n_head", "vocab_size", "max_seq_len"}, got %s`, describe(n))
		}
	} else if opts.LookupShape != nil {
		if shape, err := opts.LookupShape(st.Model.Name); err == nil {
			st.Model.Shape = &shape
		}
	}
	s.intKey("devices", &st.Devices, atLeast(1))
	if s.has("devices") {
		st.devicesFrom = "strata.devices in " + s.d.name()
	}
	s.stringKey("backend", &st.Backend, "cpu", "cuda")
	s.bytesKey("hbm_bytes", &st.HBMBytes, nil)
	s.bytesKey("host_budget", &st.HostBudgetBytes, nil)
	s.intKey("seq_len", &st.SeqLen, atLeast(0))
	s.stringKey("data", &st.Data)
	s.stringKey("data_columns", &st.DataColumns)
	if n := s.get("seed"); n != nil {
		v, msg := wholeNumber(n)
		if msg == "" && v < 0 {
			msg = fmt.Sprintf("%d is negative", v)
		}
		if msg != "" {
			s.d.errAt(n.offset, "strata.seed", "%s", msg)
		} else {
			st.Seed = uint64(v)
		}
	}
	s.stringKey("overlap", &st.Overlap, "exact", "serial", "dpu")
	s.intKey("dpu_warmup_steps", &st.DPUWarmupSteps, atLeast(0))
	s.boolKey("update_in_backward", &st.UpdateInBackward)
	s.intKey("steps", &st.Steps, atLeast(1))
	s.patternsKey("freeze", &st.Freeze)
	if s.has("lora") {
		decodeLoRA(s.sub("lora"), st)
	} else {
		s.get("lora") // known, for the unknown-key check
	}
	s.stringKey("activation_dtype", &st.ActivationDType, ActivationBF16, ActivationFP32)
	s.boolKey("deterministic", &st.Deterministic)
	os := s.sub("optimizer_state")
	os.stringKey("moments", &st.OptimizerState.Moments, MomentsFP32, MomentsBF16, MomentsInt8)
	if c.BF16.OptimizerStates {
		if os.has("moments") && st.OptimizerState.Moments != MomentsBF16 {
			os.d.errPath("strata.optimizer_state.moments", "%q contradicts bf16.bf16_optimizer_states true (bf16 moments); keep one of them", st.OptimizerState.Moments)
		}
		st.OptimizerState.Moments = MomentsBF16
	}
	os.stringKey("master", &st.OptimizerState.Master, MasterFP32, MasterBF16Remainder)
	if sh := st.Model.Shape; sh != nil && st.SeqLen > sh.MaxSeq {
		s.d.errPath("strata.seq_len", "%d is longer than the model's max_seq_len %d", st.SeqLen, sh.MaxSeq)
	}
}

// decodeLoRA reads strata.lora.
func decodeLoRA(s *section, st *Strata) {
	if s.n == nil || s.n.kind != kindObject {
		s.d.errPath("strata.lora", "want an object {\"r\", \"alpha\", \"target_modules\", ...}")
		return
	}
	o := &LoRA{R: 8, Alpha: 8}
	s.intKey("r", &o.R, atLeast(1))
	s.floatKey("alpha", &o.Alpha, func(v float64) string {
		if v <= 0 {
			return fmt.Sprintf("%g must be > 0", v)
		}
		return ""
	})
	s.floatKey("dropout", &o.Dropout, func(v float64) string {
		if v < 0 || v >= 1 {
			return fmt.Sprintf("%g is not in [0, 1)", v)
		}
		return ""
	})
	s.boolKey("use_rslora", &o.UseRSLoRA)
	if n := s.get("target_modules"); n != nil {
		path := "strata.lora.target_modules"
		switch {
		case n.kind == kindString && n.text == "all-linear":
			o.TargetModules = []string{"all-linear"}
		case n.kind != kindArray:
			s.d.errAt(n.offset, path, `want a list of module names such as ["q_proj", "v_proj"], got %s`, describe(n))
		case len(n.elems) == 0:
			s.d.errAt(n.offset, path, "the list is empty: name the linears to adapt")
		default:
			for i, e := range n.elems {
				if e.kind != kindString || strings.TrimSpace(e.text) == "" {
					s.d.errAt(e.offset, fmt.Sprintf("%s[%d]", path, i), "want a module name, got %s", describe(e))
					return
				}
				o.TargetModules = append(o.TargetModules, e.text)
			}
		}
	}
	s.stringKey("base_dtype", &o.BaseDType, BaseDTypes...)
	if n := s.get("bias"); n != nil && !(n.kind == kindString && n.text == "none") {
		s.d.errAt(n.offset, "strata.lora.bias", `only "none" is built (the base's biases stay frozen); got %s`, describe(n))
	}
	st.LoRA = o
}

func decodeShape(s *section) *Shape {
	sh := &Shape{}
	s.stringKey("name", &sh.Name)
	fields := []struct {
		key string
		dst *int
	}{{"n_layer", &sh.Layers}, {"n_embd", &sh.Dim}, {"n_head", &sh.Heads}, {"vocab_size", &sh.Vocab}, {"max_seq_len", &sh.MaxSeq}}
	var missing []string
	for _, f := range fields {
		if !s.has(f.key) {
			s.get(f.key)
			missing = append(missing, f.key)
			continue
		}
		s.intKey(f.key, f.dst, atLeast(1))
	}
	// The Llama family's keys (model.Shape documents their defaults).
	s.stringKey("arch", &sh.Arch, llamaArchs...)
	s.intKey("n_kv_head", &sh.KVHeads, atLeast(1))
	s.intKey("n_inner", &sh.FFN, atLeast(1))
	s.floatKey("rope_theta", &sh.RopeTheta, nonNegative)
	s.floatKey("norm_eps", &sh.NormEps, nonNegative)
	s.boolKey("tie_word_embeddings", &sh.TieEmbeddings)
	// The attention variants of the Llama family's members (model.Shape
	// checks how they go together).
	s.intKey("head_dim", &sh.HeadDimension, atLeast(1))
	if s.has("rope_scaling") {
		decodeRope(s.sub("rope_scaling"), &sh.Rope)
	}
	s.floatKey("partial_rotary_factor", &sh.RotaryFraction, nonNegative)
	s.intKey("sliding_window", &sh.SlidingWindow, atLeast(1))
	s.stringKey("layer_types", &sh.LayerTypes)
	for _, f := range []struct {
		key string
		dst *float64
	}{{"rope_local_base_freq", &sh.RopeLocalTheta}, {"query_pre_attn_scalar", &sh.QueryScale},
		{"attn_logit_softcapping", &sh.AttnSoftCap}, {"final_logit_softcapping", &sh.FinalSoftCap}} {
		s.floatKey(f.key, f.dst, nonNegative)
	}
	// A mixture of experts' keys (model.Shape checks them).
	s.intKey("num_experts", &sh.Experts, atLeast(1))
	s.intKey("num_experts_per_tok", &sh.TopK, atLeast(1))
	s.intKey("moe_intermediate_size", &sh.ExpertFFN, atLeast(1))
	s.boolKey("norm_topk_prob", &sh.NormTopK)
	s.stringKey("mlp_layers", &sh.MLPLayers)
	s.boolKey("output_router_logits", &sh.RouterAux)
	s.floatKey("router_aux_loss_coef", &sh.RouterAuxCoef, nonNegative)
	variants := sh.HeadDimension != 0 || sh.Rope != (RopeScaling{}) || sh.RotaryFraction != 0 || sh.SlidingWindow != 0 || sh.LayerTypes != "" ||
		sh.RopeLocalTheta != 0 || sh.QueryScale != 0 || sh.AttnSoftCap != 0 || sh.FinalSoftCap != 0
	switch {
	case len(missing) > 0:
		s.d.errAt(s.n.offset, s.path, "missing %s", strings.Join(missing, ", "))
	case sh.Heads > 0 && sh.HeadDimension == 0 && sh.Dim%sh.Heads != 0:
		s.d.errPath("strata.model.n_embd", "%d is not a multiple of n_head %d", sh.Dim, sh.Heads)
	case sh.KVHeads > 0 && sh.Heads%sh.KVHeads != 0:
		s.d.errPath("strata.model.n_kv_head", "n_head %d is not a multiple of %d", sh.Heads, sh.KVHeads)
	case (sh.Arch == "" || sh.Arch == "gpt2") && (sh.KVHeads > 0 || sh.RopeTheta != 0 || sh.TieEmbeddings || variants):
		s.d.errPath("strata.model.arch", "n_kv_head, rope_theta, tie_word_embeddings and the attention variants need an arch of the Llama family (%s)", strings.Join(llamaArchs[1:], ", "))
	}
	return sh
}

// llamaArchs are the archs strata.model takes (model.Archs): GPT-2's, then
// the Llama family's.
var llamaArchs = []string{"gpt2", "llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen3_moe"}

// decodeRope reads strata.model.rope_scaling (model.RopeScaling's keys).
func decodeRope(s *section, r *RopeScaling) {
	s.stringKey("rope_type", &r.Type)
	s.intKey("original_max_position_embeddings", &r.OriginalMax, atLeast(1))
	for _, f := range []struct {
		key string
		dst *float64
	}{{"factor", &r.Factor}, {"low_freq_factor", &r.LowFreqFactor}, {"high_freq_factor", &r.HighFreqFactor},
		{"attention_factor", &r.AttentionFactor}, {"beta_fast", &r.BetaFast}, {"beta_slow", &r.BetaSlow},
		{"mscale", &r.Mscale}, {"mscale_all_dim", &r.MscaleAllDim}} {
		s.floatKey(f.key, f.dst, nonNegative)
	}
	s.boolKey("no_truncate", &r.NoTruncate)
	s.stringKey("short_factor", &r.ShortFactor)
	s.stringKey("long_factor", &r.LongFactor)
}

// crossChecks are the rules that involve more than one key.
func (c *Config) crossChecks(d *decoder) {
	z := &c.ZeRO
	if z.OffloadParam.Device != DeviceNone && z.Stage != 3 {
		d.errPath("zero_optimization.offload_param.device", "%q needs stage 3 (parameters are sharded only at stage 3), but stage is %d", z.OffloadParam.Device, z.Stage)
	}
	if z.OffloadOptimizer.Device != DeviceNone && z.Stage == 0 {
		d.errPath("zero_optimization.offload_optimizer.device", "%q needs stage 1, 2 or 3 (the optimizer state is sharded from stage 1 on), but stage is 0", z.OffloadOptimizer.Device)
	}
	if c.NarrowMoments() && z.OffloadOptimizer.Device == DeviceNone {
		d.errPath("strata.optimizer_state.moments", "%q needs the optimizer offloaded (narrow moments are cpuadam's): set zero_optimization.offload_optimizer.device to \"cpu\" or \"nvme\", or write \"fp32\"", c.Strata.OptimizerState.Moments)
	}
	if c.RemainderMaster() && z.OffloadOptimizer.Device == DeviceNone {
		d.errPath("strata.optimizer_state.master", "%q needs the optimizer offloaded (the remainder is cpuadam's): set zero_optimization.offload_optimizer.device to \"cpu\" or \"nvme\", or write \"fp32\"", MasterBF16Remainder)
	}
	if c.RemainderMaster() && c.FP16.Enabled {
		d.errPath("strata.optimizer_state.master", "%q needs bf16 params (the master's high half is the bf16 param; fp16 params are not): enable bf16 instead of fp16, or write \"fp32\"", MasterBF16Remainder)
	}
	if z.OffloadParam.Device == DeviceNVMe && len(z.OffloadParam.NVMePath) == 0 {
		d.errPath("zero_optimization.offload_param.device", `"nvme" needs nvme_path (a directory on the NVMe drive, or a list of them)`)
	}
	if z.OffloadOptimizer.Device == DeviceNVMe && len(z.OffloadOptimizer.NVMePath) == 0 {
		d.errPath("zero_optimization.offload_optimizer.device", `"nvme" needs nvme_path (a directory on the NVMe drive, or a list of them)`)
	}
	if sh := c.Strata.Model.Shape; sh != nil {
		c.ResolveModel(*sh)
	}
	c.checkActivations(d)
	for _, k := range z.auto {
		d.errPath("zero_optimization."+k, `"auto" needs the model's hidden size, but strata.model %q was not looked up`, c.Strata.Model.Name)
	}
}

// resolveBatch applies DeepSpeed's rules: train_batch_size =
// train_micro_batch_size_per_gpu × gradient_accumulation_steps × devices;
// any two of the three determine the third; with only train_batch_size,
// accumulation is 1; with only the micro-batch, accumulation is 1.
func (c *Config) resolveBatch() error {
	tb, mb, ga, n := c.batch.train, c.batch.micro, c.batch.accum, c.Strata.Devices
	switch {
	case tb > 0 && mb > 0 && ga > 0:
		if tb != mb*ga*n {
			return fmt.Errorf("train_batch_size %d != train_micro_batch_size_per_gpu %d × gradient_accumulation_steps %d × devices %d = %d",
				tb, mb, ga, n, mb*ga*n)
		}
	case tb > 0 && mb > 0:
		if tb%(mb*n) != 0 {
			return fmt.Errorf("train_batch_size %d is not a multiple of train_micro_batch_size_per_gpu %d × devices %d = %d, so gradient_accumulation_steps cannot be derived",
				tb, mb, n, mb*n)
		}
		ga = tb / (mb * n)
	case tb > 0 && ga > 0:
		if tb%(ga*n) != 0 {
			return fmt.Errorf("train_batch_size %d is not a multiple of gradient_accumulation_steps %d × devices %d = %d, so train_micro_batch_size_per_gpu cannot be derived",
				tb, ga, n, ga*n)
		}
		mb = tb / (ga * n)
	case mb > 0 && ga > 0:
		tb = mb * ga * n
	case tb > 0:
		if tb%n != 0 {
			return fmt.Errorf("train_batch_size %d is not a multiple of devices %d", tb, n)
		}
		ga, mb = 1, tb/n
	case mb > 0:
		ga, tb = 1, mb*n
	default:
		return errors.New("set train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed needs at least one of them)")
	}
	c.TrainBatchSize, c.TrainMicroBatchSizePerGPU, c.GradientAccumulationSteps = tb, mb, ga
	return nil
}

// SetDevices runs the config on n devices (cmd's --devices, which decides:
// strata.devices is only the default, as in DeepSpeed, where the launcher
// decides). The batch keys the file gave must still multiply out; the
// others are derived again.
func (c *Config) SetDevices(n int) error {
	if n < 1 {
		return fmt.Errorf("config: %d devices: need at least 1", n)
	}
	if c.batch == (batchGiven{}) { // built in code: keep the micro-batch and accumulation
		c.batch = batchGiven{micro: c.TrainMicroBatchSizePerGPU, accum: c.GradientAccumulationSteps}
	}
	old, oldFrom := c.Strata.Devices, c.Strata.devicesFrom
	c.Strata.Devices, c.Strata.devicesFrom = n, "--devices"
	if err := c.resolveBatch(); err != nil {
		src := c.batchSources()
		c.Strata.Devices, c.Strata.devicesFrom = old, oldFrom
		return fmt.Errorf("config: with %d devices: %w (%s)", n, err, src)
	}
	return nil
}

// batchSources says where the factors of the batch arithmetic came from:
// the batch keys from the file (or "auto"), the device count from
// --devices, strata.devices or the default.
func (c *Config) batchSources() string {
	src := c.file
	if src == "" {
		src = "the config"
	}
	var keys []string
	for _, k := range []struct {
		name string
		v    int
	}{{"train_batch_size", c.batch.train}, {"train_micro_batch_size_per_gpu", c.batch.micro}, {"gradient_accumulation_steps", c.batch.accum}} {
		if k.v > 0 {
			keys = append(keys, k.name)
		}
	}
	given := "no batch key"
	if len(keys) > 0 {
		given = strings.Join(keys, ", ") + " from " + src
	}
	devs := fmt.Sprintf("devices %d from %s", c.Strata.Devices, c.Strata.devicesFrom)
	if c.Strata.devicesFrom == "" {
		devs = fmt.Sprintf("devices %d is the default (no --devices, no strata.devices)", c.Strata.Devices)
	}
	return given + "; " + devs
}

// Validate checks the resolved values, for a Config built or changed in code
// as much as for a parsed one.
func (c *Config) Validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if c.TrainMicroBatchSizePerGPU < 1 || c.GradientAccumulationSteps < 1 || c.Strata.Devices < 1 {
		bad("train_micro_batch_size_per_gpu %d, gradient_accumulation_steps %d and strata.devices %d must be at least 1",
			c.TrainMicroBatchSizePerGPU, c.GradientAccumulationSteps, c.Strata.Devices)
	} else if c.TrainBatchSize != c.TrainMicroBatchSizePerGPU*c.GradientAccumulationSteps*c.Strata.Devices {
		bad("train_batch_size %d != train_micro_batch_size_per_gpu %d × gradient_accumulation_steps %d × devices %d = %d",
			c.TrainBatchSize, c.TrainMicroBatchSizePerGPU, c.GradientAccumulationSteps, c.Strata.Devices,
			c.TrainMicroBatchSizePerGPU*c.GradientAccumulationSteps*c.Strata.Devices)
	}
	o := c.Optimizer
	if o.Type != "Adam" && o.Type != "AdamW" {
		bad("optimizer.type %q is not \"Adam\" or \"AdamW\"", o.Type)
	}
	if !(o.Params.LR >= 0) || !(o.Params.Eps > 0) || !(o.Params.WeightDecay >= 0) {
		bad("optimizer.params: lr %v and weight_decay %v must be >= 0, eps %v > 0", o.Params.LR, o.Params.WeightDecay, o.Params.Eps)
	}
	for i, b := range o.Params.Betas {
		if !(b >= 0 && b < 1) {
			bad("optimizer.params.betas[%d] %v is not in [0, 1)", i, b)
		}
	}
	sp := c.Scheduler.Params
	switch c.Scheduler.Type {
	case "", "WarmupLR":
	case "WarmupDecayLR":
		if sp.TotalNumSteps < 1 {
			bad("scheduler.params.total_num_steps %d must be at least 1 for WarmupDecayLR", sp.TotalNumSteps)
		}
	default:
		bad("scheduler.type %q is not \"WarmupLR\" or \"WarmupDecayLR\"", c.Scheduler.Type)
	}
	if c.Scheduler.Type != "" && (sp.WarmupType != "log" && sp.WarmupType != "linear" || sp.WarmupNumSteps < 0 || sp.WarmupMinLR < 0 || sp.WarmupMaxLR < 0) {
		bad("scheduler.params: warmup_type %q must be \"log\" or \"linear\", warmup_num_steps %d and the learning rates must be >= 0", sp.WarmupType, sp.WarmupNumSteps)
	}
	switch f := c.FP16; {
	case c.BF16.Enabled == f.Enabled:
		bad("bf16.enabled %v and fp16.enabled %v: Strata trains in bf16 or fp16 mixed precision, enable exactly one", c.BF16.Enabled, f.Enabled)
	case f.Enabled && (f.LossScale < 0 || f.InitialScalePower < 0 || f.InitialScalePower > 100 || f.LossScaleWindow < 1 || f.Hysteresis < 1 || !(f.MinLossScale > 0)):
		bad("fp16: loss_scale %v must be >= 0, initial_scale_power %d 0 to 100, loss_scale_window %d and hysteresis %d >= 1, min_loss_scale %v > 0",
			f.LossScale, f.InitialScalePower, f.LossScaleWindow, f.Hysteresis, f.MinLossScale)
	case f.Enabled && f.LossScale != 0 && !(f.LossScale >= lossscale.MinStatic && f.LossScale <= lossscale.MaxStatic):
		bad("fp16.loss_scale %g: %s", f.LossScale, staticScaleRange)
	case f.Enabled:
		if msg := f.minScaleAbove(false); msg != "" {
			bad("fp16.min_loss_scale %s", msg)
		}
	}
	if c.GradientClipping < 0 || c.StepsPerPrint < 1 {
		bad("gradient_clipping %v must be >= 0 and steps_per_print %d >= 1", c.GradientClipping, c.StepsPerPrint)
	}
	z := c.ZeRO
	if z.Stage < 0 || z.Stage > 3 {
		bad("zero_optimization.stage %d is not 0, 1, 2 or 3", z.Stage)
	}
	for _, d := range []struct{ name, dev string }{{"offload_param", z.OffloadParam.Device}, {"offload_optimizer", z.OffloadOptimizer.Device}} {
		if d.dev != DeviceNone && d.dev != DeviceCPU && d.dev != DeviceNVMe {
			bad("zero_optimization.%s.device %q is not \"none\", \"cpu\" or \"nvme\"", d.name, d.dev)
		}
	}
	if z.OffloadParam.Device != DeviceNone && z.Stage != 3 {
		bad("zero_optimization.offload_param needs stage 3, but stage is %d", z.Stage)
	}
	if z.OffloadOptimizer.Device != DeviceNone && z.Stage == 0 {
		bad("zero_optimization.offload_optimizer needs stage 1, 2 or 3, but stage is 0")
	}
	if z.OffloadParam.Device == DeviceNVMe && len(z.OffloadParam.NVMePath) == 0 || z.OffloadOptimizer.Device == DeviceNVMe && len(z.OffloadOptimizer.NVMePath) == 0 {
		bad("offload device \"nvme\" needs nvme_path")
	}
	if len(z.auto) > 0 {
		bad("zero_optimization.%s is \"auto\" but the model shape is not resolved (see ResolveModel)", z.auto[0])
	}
	if z.ReduceBucketSize < 1 || z.Stage3ParamPersistenceThreshold < 0 {
		bad("zero_optimization.reduce_bucket_size %d must be >= 1 and stage3_param_persistence_threshold %d >= 0", z.ReduceBucketSize, z.Stage3ParamPersistenceThreshold)
	}
	a := c.AIO
	if a.BlockSize <= 0 || a.BlockSize%4096 != 0 || a.BlockSize > maxAIOBlockSize || a.QueueDepth < 1 || a.QueueDepth > maxAIOQueueDepth ||
		a.ThreadCount < 1 || a.ThreadCount > maxAIOThreadCount || a.QueueDepth*a.ThreadCount > maxAIORequests {
		bad("aio: block_size %d must be a multiple of 4096 from 4096 to %d, queue_depth %d from 1 to %d, thread_count %d from 1 to %d, and queue_depth × thread_count at most %d",
			a.BlockSize, maxAIOBlockSize, a.QueueDepth, maxAIOQueueDepth, a.ThreadCount, maxAIOThreadCount, maxAIORequests)
	}
	st := c.Strata
	if st.Backend != "cpu" && st.Backend != "cuda" {
		bad("strata.backend %q is not \"cpu\" or \"cuda\"", st.Backend)
	}
	if st.Overlap != "exact" && st.Overlap != "serial" && st.Overlap != "dpu" {
		bad("strata.overlap %q is not \"exact\", \"serial\" or \"dpu\"", st.Overlap)
	}
	if st.Steps < 1 || st.SeqLen < 0 || st.HBMBytes < 0 || st.HostBudgetBytes < 0 {
		bad("strata: steps %d must be >= 1; seq_len %d, hbm_bytes %d and host_budget %d must be >= 0", st.Steps, st.SeqLen, st.HBMBytes, st.HostBudgetBytes)
	}
	if st.Model.Name == "" && st.Model.Shape == nil {
		bad("strata.model is not set")
	}
	if m, ma := st.OptimizerState.Moments, st.OptimizerState.Master; m != MomentsFP32 && m != MomentsBF16 && m != MomentsInt8 || ma != "" && ma != MasterFP32 && ma != MasterBF16Remainder {
		bad("strata.optimizer_state: moments %q is not \"fp32\", \"bf16\" or \"int8\", or master %q is not \"fp32\" or \"bf16+remainder\"", m, ma)
	}
	if st.ActivationDType != ActivationBF16 && st.ActivationDType != ActivationFP32 {
		bad("strata.activation_dtype %q is not \"bf16\" or \"fp32\"", st.ActivationDType)
	}
	if ac := c.ActivationCheckpointing; ac != nil && (ac.NumberCheckpoints < 0 || st.Model.Shape != nil && ac.NumberCheckpoints > st.Model.Shape.Layers) {
		bad("activation_checkpointing.number_checkpoints %d: want 1 to the model's blocks, or 0 for every block", ac.NumberCheckpoints)
	}
	for i, p := range st.Freeze {
		if msg := patternProblem(p); msg != "" {
			bad("strata.freeze[%d]: %s", i, msg)
		}
	}
	if o := st.LoRA; o != nil {
		switch {
		case o.R < 1 || !(o.Alpha > 0) || !(o.Dropout >= 0 && o.Dropout < 1):
			bad("strata.lora: r %d must be >= 1, alpha %g > 0 and dropout %g in [0, 1)", o.R, o.Alpha, o.Dropout)
		case len(st.Freeze) > 0:
			bad("strata.freeze with strata.lora: LoRA freezes the whole base already and trains only the adapters; leave strata.freeze out")
		case o.BaseDType != "" && o.BaseDType != BaseBF16 && (z.Stage != 3 || z.OffloadParam.Device == DeviceNone || z.OffloadParam.Device == ""):
			bad("strata.lora.base_dtype %q: the base streams from host RAM or NVMe coded and is decoded on the device: set zero_optimization.stage 3 and offload_param.device \"cpu\" or \"nvme\" (or write \"bf16\")", o.BaseDType)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("config: %s", strings.Join(errs, "; "))
	}
	return nil
}
