package estimate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// DefaultShardAlignElems is the alignment of every rank's slice of a chunk,
// in elements: 64 elements are whole cache lines in every dtype (128 B of
// bf16, 256 B of fp32) and whole AVX-512 vectors, so no two ranks' slices
// share a cache line and the kernels see no ragged tails. The shards need no I/O
// alignment: the tier store pads its host buffers and NVMe extents to the
// I/O alignment itself (IOAlignBytes), and the pinned buffers of the host
// optimizer are padded by the pool. (A 4 KiB alignment, 2048 elements of
// bf16, would pad the small models' state by up to 5 %.)
const DefaultShardAlignElems = 64

// IOAlignBytes is what a shard's copy costs beyond its bytes in the tier
// store's host and NVMe budgets: pinned buffers and swap extents are
// rounded up to 4 KiB (the pinned pool's and the swap's alignment, O_DIRECT's
// unit). Budgets and the planner's sizes count shards rounded up to it.
const IOAlignBytes = 4096

// IOBytes is b rounded up to IOAlignBytes.
func IOBytes(b int64) int64 { return units.AlignUp(b, IOAlignBytes) }

// ChunkParams returns the parameter count of each chunk of l in layout
// order (for a decoder of package model: chunk 0 the embeddings, chunks
// 1..L the transformer blocks, chunk L+1 the final norm and an untied
// output head). They sum to l.ParamCount().
func ChunkParams(l *model.Layout) []int64 {
	out := make([]int64, len(l.Chunks))
	for c, ch := range l.Chunks {
		out[c] = int64(ch.Len)
	}
	return out
}

// ShardElems is the length of each rank's slice of a chunk of chunkParams
// elements sharded over devices ranks: ceil(chunkParams/devices) rounded up
// to alignElems. Rank r owns elements [r·len, (r+1)·len) of the chunk padded
// to devices·len; the padding is zero and is never updated.
func ShardElems(chunkParams int64, devices int, alignElems int64) int64 {
	if chunkParams < 1 || devices < 1 || alignElems < 1 {
		panic(fmt.Sprintf("engine: ShardElems(%d, %d, %d): arguments must be positive", chunkParams, devices, alignElems))
	}
	n := int64(devices)
	per := (chunkParams + n - 1) / n
	return (per + alignElems - 1) / alignElems * alignElems
}

// Options say where ZeRO keeps model state for mixed-precision Adam:
// bf16 params and gradients, fp32 master weights and Adam moments (K = 12
// bytes of optimizer state per parameter).
type Options struct {
	ChunkParams []int64 // parameters per chunk, forward order (ChunkParams, or one chunk of Ψ)
	Devices     int     // N, ranks sharing the model state
	// LocalDevices are the ranks of one node (process) among the N, which
	// share its host RAM, host budget and NVMe (0: all N, one node).
	LocalDevices int
	Stage        int // ZeRO stage 0-3

	// OptimizerTier holds fp32 master, m and v: HBM (offload_optimizer none),
	// Host (cpu: ZeRO-Offload) or NVMe (ZeRO-Infinity). Host and NVMe need
	// stage >= 1.
	OptimizerTier shard.Tier
	// ParamTier holds each rank's bf16 param shard between uses: HBM, Host
	// or NVMe; Host and NVMe need stage 3.
	ParamTier shard.Tier

	ShardAlignElems int64       // alignment of each rank's slice; 0 = DefaultShardAlignElems, 1 = none
	HostGradDType   dtype.DType // the reduced gradient shard copied to host when the optimizer is offloaded (the device precision); 0 = BF16
	// MomentsDType is Adam's m and v of an offloaded optimizer: F32 (0),
	// BF16 or Q8 (strata.optimizer_state.moments; dtype.Q8's Bytes).
	MomentsDType dtype.DType
	// MasterDType is the master of an offloaded optimizer: F32 or Rem16
	// (strata.optimizer_state.master "bf16+remainder": its bf16 param, kept
	// as the param, plus dtype.Rem16's Bytes beside it); 0 is
	// config.MasterFormat's default, Rem16 with OptimizerTier NVMe and bf16
	// gradients, else F32 (StateDType).
	MasterDType dtype.DType
	// HostBudgetBytes (all ranks): with the optimizer on NVMe, optimizer
	// state stays in host RAM up to this budget and only the rest is on
	// NVMe. With the optimizer on the host, exceeding it is noted. 0 = none.
	HostBudgetBytes int64
	// PersistenceThreshold: at stage 3, a chunk with fewer parameters stays
	// gathered (all N shards, on the device) like DeepSpeed's
	// stage3_param_persistence_threshold (Persistent: not the frozen chunks
	// stored coded). 0 = every chunk is sharded.
	PersistenceThreshold int64
	// Frozen[c] says that chunk c does not train (strata.freeze,
	// FrozenChunks): it keeps its params only, no gradient and no
	// optimizer state. nil: every chunk trains.
	Frozen []bool
	// FrozenParamDType is how the frozen chunks' param shards are stored
	// in ParamTier when that is host RAM or NVMe at stage 3
	// (strata.lora.base_dtype): dtype.NF4 or dtype.INT8, or 0 for bf16.
	FrozenParamDType dtype.DType
	// Inference says that nothing trains on purpose (an evaluation
	// streamed through the tiers, engine.Options.Inference): every chunk
	// may be frozen.
	Inference bool
	// ActivationHostBytes is, per rank, the host RAM the tier store's
	// saved block inputs take (cpu_checkpointing; each rounded up to
	// IOAlignBytes): with the optimizer on NVMe and a host budget, it
	// comes out of the budget before any optimizer state is kept in RAM.
	ActivationHostBytes int64
}

// IsFrozen says whether chunk c is frozen.
func (o Options) IsFrozen(c int) bool { return c < len(o.Frozen) && o.Frozen[c] }

// Persistent says whether chunk c stays gathered on every device at stage
// 3: it has fewer parameters than PersistenceThreshold, and it is not a
// frozen chunk stored coded (FrozenParamDType with ParamTier host RAM or
// NVMe: strata.lora.base_dtype puts the base there in 4 or 8 bits, which
// a gathered bf16 copy would not be, so the threshold does not keep it).
func (o Options) Persistent(c int) bool {
	if o.Stage != 3 || c >= len(o.ChunkParams) || o.ChunkParams[c] >= o.PersistenceThreshold {
		return false
	}
	return !(o.FrozenParamDType != 0 && o.ParamTier != shard.HBM && o.IsFrozen(c))
}

// ParamOffloadNote says, when the params are offloaded (ParamTier host RAM
// or NVMe) but every chunk stays gathered on the devices (Persistent: all
// below the persistence threshold), that none is offloaded and how to
// change it; "" otherwise.
func (o Options) ParamOffloadNote() string {
	if o.Stage != 3 || o.ParamTier == shard.HBM {
		return ""
	}
	for c := range o.ChunkParams {
		if !o.Persistent(c) {
			return ""
		}
	}
	return fmt.Sprintf("offload_param %s: every chunk has fewer than stage3_param_persistence_threshold %d params and stays gathered on the devices, so no param is offloaded; lower zero_optimization.stage3_param_persistence_threshold (0 shards every chunk) to offload them",
		DeviceName(o.ParamTier), o.PersistenceThreshold)
}

// Validate says what is wrong with o.
func (o Options) Validate() error {
	switch {
	case len(o.ChunkParams) == 0:
		return errors.New("engine: estimate: no chunks")
	case o.Devices < 1:
		return fmt.Errorf("engine: estimate: %d devices: need at least 1", o.Devices)
	case o.LocalDevices < 0 || o.LocalDevices > o.Devices || (o.LocalDevices > 0 && o.Devices%o.LocalDevices != 0):
		return fmt.Errorf("engine: estimate: %d devices per node of %d: the nodes must split them evenly", o.LocalDevices, o.Devices)
	case o.Stage < 0 || o.Stage > 3:
		return fmt.Errorf("engine: estimate: stage %d is not 0, 1, 2 or 3", o.Stage)
	case o.OptimizerTier >= shard.Tier(shard.TierCount) || o.ParamTier >= shard.Tier(shard.TierCount):
		return errors.New("engine: estimate: unknown tier")
	case o.OptimizerTier != shard.HBM && o.Stage == 0:
		return fmt.Errorf("engine: estimate: offload_optimizer %s needs stage 1, 2 or 3 (the optimizer state is sharded from stage 1 on)", DeviceName(o.OptimizerTier))
	case o.ParamTier != shard.HBM && o.Stage != 3:
		return fmt.Errorf("engine: estimate: offload_param %s needs stage 3 (parameters are sharded only at stage 3)", DeviceName(o.ParamTier))
	case o.ShardAlignElems < 0 || o.HostBudgetBytes < 0 || o.PersistenceThreshold < 0 || o.ActivationHostBytes < 0:
		return errors.New("engine: estimate: alignment, host budget, persistence threshold and activation host bytes must be >= 0")
	case o.HostGradDType != 0 && !o.HostGradDType.Half() && o.HostGradDType != dtype.F32:
		return fmt.Errorf("engine: estimate: host gradient dtype %s is not bf16, f16 or f32", o.HostGradDType)
	}
	for i, c := range o.ChunkParams {
		if c < 1 {
			return fmt.Errorf("engine: estimate: chunk %d has %d parameters", i, c)
		}
	}
	if err := CheckSize(o); err != nil {
		return err
	}
	if len(o.Frozen) > 0 {
		if len(o.Frozen) != len(o.ChunkParams) {
			return fmt.Errorf("engine: estimate: %d frozen flags for %d chunks", len(o.Frozen), len(o.ChunkParams))
		}
		if !o.Inference && !slices.Contains(o.Frozen, false) {
			return errors.New("engine: estimate: every chunk is frozen: nothing would train")
		}
	}
	return nil
}

// CheckSize refuses options whose model-state sizes could pass int64
// (Memory would wrap them, to 0 or negative sizes): every chunk padded to
// Devices slices of ShardAlignElems-aligned elements (0: the default), at
// 32 bytes an element (twice the 16 of mixed-precision Adam, to spare),
// summed. The error matches ErrTooLarge.
func CheckSize(o Options) error {
	align := o.ShardAlignElems
	if align == 0 {
		align = DefaultShardAlignElems
	}
	n := int64(max(o.Devices, 1))
	var total int64
	ok := align > 0
	for _, c := range o.ChunkParams {
		if !ok {
			break
		}
		per := c / n
		if c%n != 0 {
			per++
		}
		var padded int64
		if padded, ok = units.Add(per, align-1); ok {
			padded, ok = units.Mul(padded/align*align, n, 32)
		}
		if ok {
			total, ok = units.Add(total, padded)
		}
	}
	if !ok {
		return fmt.Errorf("engine: estimate: %d chunks on %d devices in slices aligned to %d elements: the model state's sizes pass int64: %w", len(o.ChunkParams), n, align, ErrTooLarge)
	}
	return nil
}

// DeviceName is DeepSpeed's name of a tier in offload_*.device.
func DeviceName(t shard.Tier) string {
	switch t {
	case shard.HBM:
		return config.DeviceNone
	case shard.Host:
		return config.DeviceCPU
	}
	return config.DeviceNVMe
}

// Coef is a memory formula in the reference text's form: Full·Ψ +
// PerN·Ψ/N bytes, and with frozen chunks (Options.Frozen) also
// TrainFull·Ψₜ + TrainPerN·Ψₜ/N for the states only trainable parameters
// have (gradients, master, m, v), Ψₜ being the trainable parameters. With
// nothing frozen Ψₜ = Ψ and every term is on Ψ.
type Coef struct{ Full, PerN, TrainFull, TrainPerN float64 }

// Bytes evaluates the formula for params = Ψ, trainable = Ψₜ.
func (c Coef) Bytes(params, trainable int64, devices int) float64 {
	return c.Full*float64(params) + c.PerN*float64(params)/float64(devices) +
		c.TrainFull*float64(trainable) + c.TrainPerN*float64(trainable)/float64(devices)
}

func (c Coef) add(d Coef) Coef {
	return Coef{c.Full + d.Full, c.PerN + d.PerN, c.TrainFull + d.TrainFull, c.TrainPerN + d.TrainPerN}
}

// String writes "16Ψ", "4Ψ + 12Ψ/N", "16Ψ/N", "2Ψ/N + 14Ψₜ/N" or "0".
func (c Coef) String() string {
	var terms []string
	term := func(v float64, unit string) {
		if v != 0 {
			terms = append(terms, strconv.FormatFloat(v, 'g', 4, 64)+unit)
		}
	}
	term(c.Full, "Ψ")
	term(c.PerN, "Ψ/N")
	term(c.TrainFull, "Ψₜ")
	term(c.TrainPerN, "Ψₜ/N")
	if len(terms) == 0 {
		return "0"
	}
	return strings.Join(terms, " + ")
}

// ModelState is the model state of one rank, per state and tier, exact
// to the byte for Strata's layout (padded shards, persistent chunks), next
// to the reference text's formula. It does not include the working set
// (gathered chunks in flight, gradient buckets, staging buffers,
// activations): the engine reports that separately.
type ModelState struct {
	Options Options // with defaults filled in
	Params  int64   // Ψ
	// TrainableParams (Ψₜ) and FrozenParams are Ψ split by
	// Options.Frozen; Ψₜ = Ψ with nothing frozen.
	TrainableParams, FrozenParams int64
	ShardElems                    []int64 // per chunk, see ShardElems
	RankElems                     int64   // Σ ShardElems: elements each rank owns
	PaddedElems                   int64   // Σ N·ShardElems: a gathered (replicated) copy of the model
	PersistentElems               int64   // stage 3: Σ N·ShardElems of the chunks that stay gathered
	// PersistentBytes is what the persistent chunks add to each device
	// beyond the formula's 2Ψ/N share of them: the other ranks' parts,
	// 2·c·(N-1)/N bytes per chunk of c params (their padding is in
	// PaddingBytes).
	PersistentBytes int64

	// PerRank[state][tier] is the bytes of one rank's model state in that
	// tier. Host and NVMe bytes are this rank's share; multiply by N for the
	// machine (HostBytes, NVMeBytes).
	PerRank [shard.StateCount][shard.TierCount]int64
	// HostStagingPerRank is the host memory the tier store keeps, per rank,
	// for shards staged through the host beyond their homes (working set,
	// not model state; see HostStagingBytes). With a host budget it comes
	// out of the budget before any optimizer state is placed in host RAM.
	HostStagingPerRank int64
	// Formula[state][tier] is the same without padding, persistence or host
	// budget, as the reference text writes it.
	Formula [shard.StateCount][shard.TierCount]Coef
	// FrozenSavedPerRank[state][tier] is the model state one rank does not
	// keep because its chunks are frozen: their gradients and master, m, v,
	// in the tier the formula places them (a host budget's split between
	// host RAM and NVMe is not applied). Zero with nothing frozen.
	FrozenSavedPerRank [shard.StateCount][shard.TierCount]int64
	// HostKept[state][chunk]: with the optimizer on NVMe and a host budget,
	// the master/m/v shards homed in host RAM (the rest are on NVMe); the
	// tier store places exactly these.
	HostKept [shard.StateCount][]bool
	Notes    []string // what the caller should know (budget exceeded, budget split)
}

// Memory computes the model-state bytes of each rank for o.
func Memory(o Options) (ModelState, error) {
	if o.ShardAlignElems == 0 {
		o.ShardAlignElems = DefaultShardAlignElems
	}
	if o.HostGradDType == 0 {
		o.HostGradDType = dtype.BF16
	}
	if o.MomentsDType == 0 || o.OptimizerTier == shard.HBM {
		o.MomentsDType = dtype.F32 // narrow moments are cpuadam's
	}
	if o.OptimizerTier == shard.HBM {
		o.MasterDType = dtype.F32 // so is the remainder
	}
	o.MasterDType = o.StateDType(shard.Master)
	if err := o.Validate(); err != nil {
		return ModelState{}, err
	}
	e := ModelState{Options: o}
	if note := o.ParamOffloadNote(); note != "" {
		e.Notes = append(e.Notes, note)
	}
	n := int64(o.Devices)
	var shardedParams int64 // stage 3: elements of the param shards that are not persistent
	// The gradients and the optimizer state exist for the trainable chunks
	// only: their elements, gathered (full) and one rank's (rank), and the
	// frozen chunks' (what freezing saves).
	var full, rank, frozenFull, frozenRank int64
	var codedElems, codedBytes int64 // frozen sharded params stored coded (FrozenParamDType)
	coded := o.FrozenParamDType != 0 && o.Stage == 3 && o.ParamTier != shard.HBM
	for i, c := range o.ChunkParams {
		s := ShardElems(c, o.Devices, o.ShardAlignElems)
		e.Params += c
		e.ShardElems = append(e.ShardElems, s)
		e.RankElems += s
		e.PaddedElems += n * s
		if o.Persistent(i) {
			e.PersistentElems += n * s
			e.PersistentBytes += 2 * c * (n - 1) / n
		} else {
			shardedParams += s
			if coded && o.IsFrozen(i) {
				codedElems += s
				codedBytes += o.FrozenParamDType.Bytes(int(s))
			}
		}
		if o.IsFrozen(i) {
			e.FrozenParams += c
			frozenFull, frozenRank = frozenFull+n*s, frozenRank+s
		} else {
			full, rank = full+n*s, rank+s
		}
	}
	e.TrainableParams = e.Params - e.FrozenParams
	const bf16, f32 = 2, 4
	put := func(st shard.State, t shard.Tier, elems, size int64, f Coef) {
		e.PerRank[st][t] += elems * size
		e.Formula[st][t] = e.Formula[st][t].add(f)
	}
	// putTrained places a state of the trainable chunks only: its formula
	// is on Ψₜ when anything is frozen, and what the frozen chunks would
	// have held is what freezing saves.
	putTrained := func(st shard.State, t shard.Tier, elems, frozenElems, size int64, f Coef) {
		if e.FrozenParams > 0 {
			f = Coef{TrainFull: f.Full, TrainPerN: f.PerN}
		}
		put(st, t, elems, size, f)
		e.FrozenSavedPerRank[st][t] += frozenElems * size
	}

	// Parameters: replicated below stage 3; at stage 3 each rank keeps its
	// shard in ParamTier, and persistent chunks stay gathered on the device.
	if o.Stage < 3 {
		put(shard.Param, shard.HBM, e.PaddedElems, bf16, Coef{Full: 2})
	} else {
		e.PerRank[shard.Param][shard.HBM] += e.PersistentElems * bf16
		if codedElems == 0 {
			put(shard.Param, o.ParamTier, shardedParams, bf16, Coef{PerN: 2})
		} else {
			// The frozen shards coded (NF4 0.5625 B/param, INT8 1.0625: the
			// codes and an fp32 scale per 64), the trainable ones in bf16.
			per := float64(o.FrozenParamDType.Bytes(64)) / 64
			put(shard.Param, o.ParamTier, shardedParams-codedElems, bf16, Coef{PerN: per, TrainPerN: 2 - per})
			e.PerRank[shard.Param][o.ParamTier] += codedBytes
		}
	}
	// Gradients: full on the device at stages 0-1, the rank's shard from
	// stage 2; with the optimizer off the device, the reduced shard is also
	// copied to host memory for the CPU optimizer.
	// ZeRO-Infinity (optimizer state on NVMe, stage 3) offloads the
	// gradient too: the reduced shard lives on the device only until its
	// copy reaches host memory (working set), and its home is host RAM,
	// or NVMe where the host budget is full.
	infinity := o.OptimizerTier == shard.NVMe && o.Stage == 3
	switch {
	case o.Stage < 2:
		putTrained(shard.Grad, shard.HBM, full, frozenFull, bf16, Coef{Full: 2})
	case !infinity:
		putTrained(shard.Grad, shard.HBM, rank, frozenRank, bf16, Coef{PerN: 2})
	}
	if o.OptimizerTier != shard.HBM {
		g := int64(o.HostGradDType.Size())
		putTrained(shard.Grad, shard.Host, rank, frozenRank, g, Coef{PerN: float64(g)})
	}
	// Optimizer state: fp32 master, m, v (m and v offloaded: in
	// MomentsDType); replicated at stage 0, the rank's shard from stage 1,
	// in OptimizerTier.
	var optRank int64
	for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV} {
		if o.Stage == 0 {
			putTrained(st, shard.HBM, full, frozenFull, f32, Coef{Full: 4})
			continue
		}
		var b, frozen int64
		for i, se := range e.ShardElems {
			if o.IsFrozen(i) {
				frozen += o.stateBytes(st, se)
			} else {
				b += o.stateBytes(st, se)
			}
		}
		putTrained(st, o.OptimizerTier, b, frozen, 1, Coef{PerN: float64(o.stateBytes(st, 1<<20)) / (1 << 20)})
		optRank += b
	}

	e.HostStagingPerRank = HostStagingBytes(o, e.ShardElems)
	local := int64(o.Local())
	switch budget := o.HostBudgetBytes; {
	case o.OptimizerTier == shard.Host && budget > 0 && (optRank+rank*int64(o.HostGradDType.Size()))*local > budget:
		e.Notes = append(e.Notes, fmt.Sprintf("optimizer state and gradient shards on the host (%s, all ranks of a node) exceed host_budget %s: use offload_optimizer nvme to spill the rest",
			units.FormatBytes((optRank+rank*int64(o.HostGradDType.Size()))*local), units.FormatBytes(budget)))
	case o.OptimizerTier == shard.NVMe && budget > 0:
		e.keepInHost(o, budget, infinity)
	}
	return e, nil
}

// keepInHost places, with the optimizer on NVMe and a host budget, the
// shards the budget keeps in host RAM (HostKept), as the tier store does.
// infinity: the gradient shards are homed off the device too (stage 3).
func (e *ModelState) keepInHost(o Options, budget int64, infinity bool) {
	const bf16 = 2
	n, local := int64(o.Devices), int64(o.Local())
	// The budget is shared by the ranks; each keeps its share in host
	// RAM: the staging room and the param shards homed in host first, then
	// master, m and v, then the gradient shards (at stage 3).
	// Each shard costs its bytes rounded up to IOAlignBytes there.
	var paramHost int64
	if o.ParamTier == shard.Host {
		for i, se := range e.ShardElems {
			if !o.Persistent(i) {
				paramHost += IOBytes(se * bf16)
			}
		}
	}
	left := max(0, TierHostBudget(budget)/local-e.HostStagingPerRank-TierSpareBytes(e.ShardElems)-paramHost-o.ActivationHostBytes)
	// Whole shards, as the tier store places them: master, m, v, each
	// chunk in order, while they fit, then the gradient shards; a
	// gradient shard that does not fit is homed on NVMe. The optimizer
	// state comes first because of when it moves: the host optimizer of
	// step t runs after its backward (the global norm) and before the
	// next forward reads each chunk, so a byte of master, m or v homed on
	// NVMe is read and written back inside that forward, where the drive
	// is the step's bottleneck; a gradient homed on NVMe is written in the
	// backward, which is compute-bound, and read once in the forward. Per
	// byte of host RAM the state saves the forward twice the drive time.
	kept := int64(0)
	for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV} {
		e.HostKept[st] = make([]bool, len(e.ShardElems))
		for i, se := range e.ShardElems {
			if o.IsFrozen(i) {
				continue // no optimizer state
			}
			if b := o.stateBytes(st, se); IOBytes(b) <= left {
				e.PerRank[st][shard.NVMe] -= b
				e.PerRank[st][shard.Host] += b
				e.HostKept[st][i] = true
				left -= IOBytes(b)
				kept += b
			}
		}
	}
	if infinity {
		g := int64(o.HostGradDType.Size())
		e.HostKept[shard.Grad] = make([]bool, len(e.ShardElems))
		for i, se := range e.ShardElems {
			if o.IsFrozen(i) {
				continue // no gradient
			}
			if b := se * g; IOBytes(b) <= left {
				e.HostKept[shard.Grad][i] = true
				left -= IOBytes(b)
			} else {
				e.PerRank[shard.Grad][shard.Host] -= b
				e.PerRank[shard.Grad][shard.NVMe] += b
			}
		}
	}
	e.Notes = append(e.Notes, fmt.Sprintf("host_budget keeps %s of optimizer state (all ranks) in host RAM, after %s of staging room; the formula column places it all on NVMe",
		units.FormatBytes(kept*n), units.FormatBytes(e.HostStagingPerRank*n)))
}

// TierHostBudget is the tier store's share of strata.host_budget
// (shard.HostShare: 4/5 of it); the pinned pool holds the whole budget, and
// the rest absorbs the fragmentation of shards of several sizes coming and
// going.
func TierHostBudget(hostBudget int64) int64 { return shard.HostShare(hostBudget) }

// TierSpareBytes is the host room, per rank, the tier store keeps for reads
// outside the plan (Engine.Params, Engine.Master): the largest fp32 shard.
func TierSpareBytes(shardElems []int64) int64 {
	var m int64
	for _, s := range shardElems {
		m = max(m, s)
	}
	return IOBytes(4 * m)
}

// TierReadAhead is how many chunks the tier store has room to stage in host
// memory at once beyond the homes: the optimizer pipeline reads ahead and
// writes behind up to this many chunks of master, m and v.
const TierReadAhead = 3

// HostStagingBytes is the host memory one rank's tier store keeps for shards
// staged through the host (ZeRO-Infinity, stage 3): TierReadAhead chunks of
// master, m and v (the largest chunk) when the optimizer state is on NVMe,
// and TierReadAhead+1 param shards when the params are on NVMe (read ahead
// NVMe->host->HBM, plus the one the optimizer is writing) — or every param
// shard when the optimizer state is in host RAM and no host budget is set.
// 0 when nothing is on NVMe.
func HostStagingBytes(o Options, shardElems []int64) int64 {
	var maxShard, maxTrained int64 // every chunk's param shard; the trainable chunks' optimizer state
	for c, s := range shardElems {
		maxShard = max(maxShard, s)
		if !o.IsFrozen(c) {
			maxTrained = max(maxTrained, s)
		}
	}
	var b int64
	if o.OptimizerTier == shard.NVMe {
		b += TierReadAhead * 3 * IOBytes(4*maxTrained)
		if o.Stage == 3 {
			// gradient shards spilled to NVMe: written in backward, read
			// back ahead of the optimizer
			b += (TierReadAhead + 1) * IOBytes(int64(max(o.HostGradDType.Size(), 2))*maxTrained)
		}
	}
	if o.ParamTier == shard.NVMe {
		b += (TierReadAhead + 1) * IOBytes(2*maxShard)
		if o.OptimizerTier == shard.Host && o.HostBudgetBytes == 0 {
			// Every param shard passes through host memory on its way up
			// (the trace's host working set is the homes plus one copy of
			// each). With the optimizer state in RAM (12 B/param) and no
			// host budget, room for that copy (2 B/param) keeps the planner
			// from dropping a param's host copy whenever HBM evicts it and
			// reading it from NVMe again.
			var all int64
			for c, s := range shardElems {
				if o.Persistent(c) {
					continue // persistent: stays gathered on the device
				}
				all += IOBytes(2 * s)
			}
			b = max(b, all)
		}
	}
	return b
}

// TierBytes is the model state of one rank in tier t.
func (e ModelState) TierBytes(t shard.Tier) int64 {
	var sum int64
	for st := range shard.StateCount {
		sum += e.PerRank[st][t]
	}
	return sum
}

// TierFormula is the formula of one rank's model state in tier t.
func (e ModelState) TierFormula(t shard.Tier) Coef {
	var c Coef
	for st := range shard.StateCount {
		c = c.add(e.Formula[st][t])
	}
	return c
}

// DeviceBytes is the model state on each device: what the engine's
// measured per-device peak is compared with (plus its working set). It is
// FormulaDeviceBytes + PaddingBytes + PersistentBytes.
func (e ModelState) DeviceBytes() int64 { return e.TierBytes(shard.HBM) }

// FormulaDeviceBytes is the reference text's formula for each device's model
// state (16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N, or the device share with the
// optimizer or params offloaded), rounded to the byte.
func (e ModelState) FormulaDeviceBytes() int64 {
	return int64(math.Round(e.TierFormula(shard.HBM).Bytes(e.Params, e.TrainableParams, e.Options.Devices)))
}

// FrozenSavedBytes is the model state the frozen chunks do not keep, all
// ranks together, in tier t (FrozenSavedPerRank).
func (e ModelState) FrozenSavedBytes(t shard.Tier) int64 {
	var sum int64
	for st := range shard.StateCount {
		sum += e.FrozenSavedPerRank[st][t]
	}
	return int64(e.Options.Devices) * sum
}

// PaddingBytes is what the shard alignment adds to each device's model
// state: DeviceBytes - FormulaDeviceBytes - PersistentBytes.
func (e ModelState) PaddingBytes() int64 {
	return max(0, e.DeviceBytes()-e.FormulaDeviceBytes()-e.PersistentBytes)
}

// Local is the ranks of one node: LocalDevices, or all N.
func (o Options) Local() int {
	if o.LocalDevices > 0 {
		return o.LocalDevices
	}
	return o.Devices
}

// NodeHostBytes is the model state in one node's host memory: its ranks'.
func (e ModelState) NodeHostBytes() int64 { return int64(e.Options.Local()) * e.TierBytes(shard.Host) }

// NodeNVMeBytes is the model state on one node's NVMe: its ranks'.
func (e ModelState) NodeNVMeBytes() int64 { return int64(e.Options.Local()) * e.TierBytes(shard.NVMe) }

// HostBytes is the model state in host memory, all ranks together.
func (e ModelState) HostBytes() int64 { return int64(e.Options.Devices) * e.TierBytes(shard.Host) }

// NVMeBytes is the model state on NVMe, all ranks together.
func (e ModelState) NVMeBytes() int64 { return int64(e.Options.Devices) * e.TierBytes(shard.NVMe) }

// Stage is the estimate of one stage; Err says why the options do
// not allow that stage (offload_optimizer at stage 0, offload_param below 3).
type Stage struct {
	Stage int
	ModelState
	Err error
}

// Stages estimates stages 0-3 with o's other settings.
func Stages(o Options) []Stage {
	out := make([]Stage, 4)
	for s := range out {
		o.Stage = s
		e, err := Memory(o)
		out[s] = Stage{Stage: s, ModelState: e, Err: err}
	}
	return out
}

// OptionsFromConfig takes stage, devices, offload tiers, host budget,
// stateBytes is the size of one rank's shard of se elements of optimizer
// state st.
func (o Options) stateBytes(st shard.State, se int64) int64 {
	return o.StateDType(st).Bytes(int(se))
}

// persistence threshold, the frozen chunks (strata.freeze, FrozenChunks)
// and the host RAM of the saved block inputs (cpu_checkpointing, bf16
// params: ActivationOptionsFromConfig) from a config, and the chunks from
// the layout (model.NewLayout of the config's shape, or a library model's).
func OptionsFromConfig(c *config.Config, l *model.Layout) (Options, error) {
	ot, err := shard.ParseTier(c.ZeRO.OffloadOptimizer.Device)
	if err != nil {
		return Options{}, fmt.Errorf("engine: zero_optimization.offload_optimizer: %w", err)
	}
	pt, err := shard.ParseTier(c.ZeRO.OffloadParam.Device)
	if err != nil {
		return Options{}, fmt.Errorf("engine: zero_optimization.offload_param: %w", err)
	}
	frozen, err := FrozenChunks(l, c.Strata.Freeze)
	if err != nil {
		return Options{}, err
	}
	s := l.Shape // zero for a library model: no saved block inputs
	return Options{
		ChunkParams:          ChunkParams(l),
		Devices:              c.Strata.Devices,
		Stage:                c.ZeRO.Stage,
		OptimizerTier:        ot,
		ParamTier:            pt,
		HostBudgetBytes:      c.Strata.HostBudgetBytes,
		PersistenceThreshold: c.ZeRO.Stage3ParamPersistenceThreshold,
		Frozen:               frozen,
		ActivationHostBytes:  InputHostBytes(s, c.TrainMicroBatchSizePerGPU, seqOf(c, s), ActivationOptionsFromConfig(c, s, gpu.BF16)),
		MomentsDType:         momentsDType(c.Strata.OptimizerState.Moments),
		MasterDType:          configMaster(c),
		FrozenParamDType:     frozenParamDType(c),
	}, nil
}

// frozenParamDType is strata.lora.base_dtype's dtype (BaseDType).
func frozenParamDType(c *config.Config) dtype.DType {
	if c.Strata.LoRA == nil {
		return 0
	}
	return BaseDType(c.Strata.LoRA.BaseDType)
}

// BaseDType is the dtype of a strata.lora.base_dtype, a name config has
// accepted: its codec's (dtype.Codecs: dtype.NF4 for "nf4", dtype.INT8 for
// "int8"), 0 for bf16 or none. It panics on a name of neither, which
// config refuses, so no unknown format is estimated as bf16.
func BaseDType(name string) dtype.DType {
	if name == "" || name == config.BaseBF16 {
		return 0
	}
	c, ok := dtype.CodecNamed(name)
	if !ok {
		panic(fmt.Sprintf("estimate: strata.lora.base_dtype %q has no codec in dtype.Codecs", name))
	}
	return c.DType
}

// momentsNames are strata.optimizer_state.moments's names of the moment dtypes.
var momentsNames = map[string]dtype.DType{config.MomentsFP32: dtype.F32, config.MomentsBF16: dtype.BF16, config.MomentsInt8: dtype.Q8}

// ParseMoments is the dtype of a strata.optimizer_state.moments name.
func ParseMoments(m string) (dtype.DType, error) {
	if dt, ok := momentsNames[m]; ok {
		return dt, nil
	}
	return 0, fmt.Errorf("estimate: moments %q is not fp32, bf16 or int8", m)
}

// MomentsName is the strata.optimizer_state.moments name of dt.
func MomentsName(dt dtype.DType) string {
	for n, d := range momentsNames {
		if d == dt {
			return n
		}
	}
	return dt.String()
}

// StateDType is the dtype an offloaded optimizer keeps state st in:
// MasterDType for the master, MomentsDType for m and v (0: F32; a master
// of 0 on NVMe with bf16 gradients is Rem16, config.MasterFormat's
// default).
func (o Options) StateDType(st shard.State) dtype.DType {
	d := o.MomentsDType
	if st == shard.Master {
		d = o.MasterDType
		if d == 0 && o.OptimizerTier == shard.NVMe && (o.HostGradDType == 0 || o.HostGradDType == dtype.BF16) {
			d = dtype.Rem16
		}
	}
	if d == 0 {
		d = dtype.F32
	}
	return d
}

// StateNote is ", int8 moments" (or bf16) for narrow moments, and ",
// bf16+remainder master" for a remainder master, else "".
func (o Options) StateNote() string {
	s := ""
	if o.StateDType(shard.AdamM) != dtype.F32 {
		s = ", " + MomentsName(o.MomentsDType) + " moments"
	}
	if o.StateDType(shard.Master) == dtype.Rem16 {
		s += ", " + config.MasterBF16Remainder + " master"
	}
	return s
}

// OptimizerBytesPerParam is master, m and v's bytes per parameter of a
// large shard (the small ones keep fp32 moments); a remainder master's
// bytes are those beside the param.
func (o Options) OptimizerBytesPerParam() float64 {
	per := func(st shard.State) float64 { return float64(o.StateDType(st).Bytes(1<<20)) / (1 << 20) }
	return per(shard.Master) + 2*per(shard.AdamM)
}

// MasterName is the strata.optimizer_state.master name of dt.
func MasterName(dt dtype.DType) string {
	if dt == dtype.Rem16 {
		return config.MasterBF16Remainder
	}
	return config.MasterFP32
}

// ParseMaster is the dtype of a strata.optimizer_state.master name ("":
// 0, the default).
func ParseMaster(m string) (dtype.DType, error) {
	switch m {
	case "":
		return 0, nil
	case config.MasterFP32:
		return dtype.F32, nil
	case config.MasterBF16Remainder:
		return dtype.Rem16, nil
	}
	return 0, fmt.Errorf("estimate: master %q is not fp32 or bf16+remainder", m)
}

// configMaster is the MasterDType of c: as written, else 0, which
// StateDType resolves for the tier the options end with (a flag of
// `strata estimate` may move the optimizer), as config.MasterFormat does;
// F32 in fp16 (the remainder completes bf16 params only).
func configMaster(c *config.Config) dtype.DType {
	if c.Strata.OptimizerState.Master == "" && c.FP16.Enabled {
		return dtype.F32
	}
	return masterDType(c.Strata.OptimizerState.Master)
}

func masterDType(m string) dtype.DType {
	dt, _ := ParseMaster(m) // config.Validate checked it
	return dt
}

func momentsDType(m string) dtype.DType {
	dt, _ := ParseMoments(m) // config.Validate checked it
	if dt == 0 {
		dt = dtype.F32
	}
	return dt
}

// seqOf is the config's tokens per sequence: strata.seq_len, or the
// model's max_seq_len.
func seqOf(c *config.Config, s model.Shape) int {
	if c.Strata.SeqLen > 0 {
		return c.Strata.SeqLen
	}
	return s.MaxSeq
}
