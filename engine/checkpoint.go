package engine

import (
	"fmt"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// Training checkpoints of an engine, written and read through checkpoint/.
//
// A checkpoint holds, per chunk and rank, the rank's slice [r·S, (r+1)·S)
// of the chunk zero-padded to N·S (whatever the stage: a replicated state is
// saved as each rank's slice of its copy), of:
//
//	param   as the devices hold it: bf16, or f32 in fp32 mode
//	master  fp32 master weights (bf16 mode only; in fp32 mode the params are
//	        the master weights)
//	adam_m, adam_v  fp32
//
// and the step counter and the run's config. Nothing else decides the
// values of the next steps: the learning rate is a function of the step
// (the config's scheduler), the sampler's windows depend only on the seed,
// the step and the row, gradients are rebuilt from zero every step, and the
// tier store's and the planners' state (residency, recorded trace, measured
// bandwidths) decide when bytes move, never what they hold. So an engine
// restored from a checkpoint continues bit-identically to the engine that
// saved it, given the same config and device count (results across device
// counts differ by the grouping of the gradient sum; see TestAcrossDeviceCounts).
//
// Where each state is read from and written to: the rank's device buffers
// (devState: params unless the tier store holds them; master, m, v with the
// device optimizer) or the tier store (master, m, v with the host
// optimizer, and the param shards under offload_param), through
// saveTiered and restoreTiered (the store's ReadNewest and WriteHome).
// Engine.Params and Engine.Master read the same way (fillChunk).
//
// A frozen chunk (strata.freeze) has no optimizer state: its checkpoint
// holds its params, as master the params widened to fp32, and zero m and
// v, so the files do not depend on the freeze set. Restored into a run
// that freezes a chunk the checkpoint trained, the chunk keeps the
// checkpoint's params and its optimizer state is not read; a chunk frozen
// in the checkpoint that trains in the restoring run is refused
// (checkFreezeRestore, from the checkpoint's config).
//
// SaveCheckpoint and LoadCheckpoint stream (checkpoint.SaveStream,
// checkpoint.Reader): one chunk of one state at a time, all ranks' shards
// side by side in one of two host buffers, so host memory for a checkpoint
// is two padded chunks of f32 state (2·N of the largest shard), not 16Ψ.
// CheckpointState and RestoreState keep the whole state in memory, for
// small models and tests.

// checkpointAlignElems is the shard alignment the engine lays chunks out
// with (estimate.OptionsFromConfig leaves the default).
const checkpointAlignElems = estimate.DefaultShardAlignElems

// CheckpointStates are the states a checkpoint of this engine holds: param
// bf16, master f32 (bf16 mode) or param f32 (fp32 mode), and adam_m and
// adam_v in their stored precision (strata.optimizer_state.moments).
func (e *Engine) CheckpointStates() []checkpoint.StateSpec {
	return checkpoint.AdamStates(e.precision, e.estimate.Options.StateDType(shard.AdamM))
}

// checkpointExpect is what this engine needs of a checkpoint.
func (e *Engine) checkpointExpect() checkpoint.Expect {
	return checkpoint.ExpectLayout(e.layout, e.n, checkpointAlignElems, e.CheckpointStates())
}

// checkpointMeta describes this engine's checkpoint (checkpoint.State
// without Data): step, config, shape (or a library model's name and
// tensors: checkpoint.LayoutChunks), devices, stage, chunks, states.
func (e *Engine) checkpointMeta() *checkpoint.State {
	want := e.checkpointExpect()
	st := &checkpoint.State{Step: e.step, FP16: e.fp16State(), Devices: e.n, Stage: e.stage, Shape: want.Shape, Model: want.Model, LoRA: want.LoRA, ShardAlignElems: checkpointAlignElems,
		Config: e.cfg.JSON(), States: want.States, Chunks: checkpoint.LayoutChunks(e.layout, e.n, checkpointAlignElems)}
	e.checkShards(st)
	return st
}

// quiesce finishes the pending host updates (settle), synchronizes every rank and pauses the tier store's planners
// (checkpoint reads and writes go around them); call resume when done,
// also after an error.
func (e *Engine) quiesce() (resume func(), err error) {
	resume = func() {}
	if err := e.settle(); err != nil {
		return resume, err
	}
	if err := e.parallel(func(r *rank) error { return r.sync() }); err != nil {
		return resume, err
	}
	if e.tiers != nil {
		resume = e.tiers.resume
		return resume, e.tiers.pause()
	}
	return resume, nil
}

// fillChunk copies every rank's shard of chunk c in state s into whole
// (rank g's per bytes at g·per) from wherever the engine keeps it, the
// ranks in parallel (each on its own streams and tier-store keys), waits
// for the copies, and with Options.Procs exchanges the processes' shards
// (every process holds the whole chunk after it).
func (e *Engine) fillChunk(c int, s shard.State, whole []byte, per int) error {
	if err := e.fillLocal(c, s, func(r *rank) []byte { return whole[r.idx*per : (r.idx+1)*per] }); err != nil {
		return err
	}
	return e.shareBytes(whole, per)
}

// fillLocal copies this process's ranks' shards of chunk c in state s into
// dst(rank), the ranks in parallel, and waits for the copies.
func (e *Engine) fillLocal(c int, s shard.State, dst func(r *rank) []byte) error {
	return e.parallel(func(r *rank) error {
		if err := r.saveShard(c, s, dst(r)); err != nil {
			return err
		}
		return r.sync() // the device reads have landed
	})
}

// restoreChunk writes every rank's shard of chunk c in state s, shards[r],
// where the engine keeps it, and waits for the copies. whole is the padded
// chunk (the shards side by side) or nil: it is built when a rank holds s
// replicated.
func (e *Engine) restoreChunk(c int, s shard.State, shards [][]byte, whole []byte) error {
	if whole == nil && (e.stage == 0 || (s == shard.Param && e.ranks[0].st.paramIsFull(c))) {
		for _, b := range shards {
			whole = append(whole, b...)
		}
	}
	// Each rank on its own goroutine (its streams, its tier-store keys);
	// the uploads read shards and whole: wait for them before returning.
	return e.parallel(func(r *rank) error {
		if err := r.restoreShard(c, s, shards[r.idx], whole); err != nil {
			return fmt.Errorf("chunk %d %s: %w", c, s, err)
		}
		return r.sync()
	})
}

// CheckpointState synchronizes the devices and returns the engine's
// training state (every rank's shards, the step, the config) as plain data
// in host memory: the model's 16Ψ bytes (14Ψ in fp32 mode). For small
// models and tests; SaveCheckpoint streams instead.
func (e *Engine) CheckpointState() (*checkpoint.State, error) {
	if e.closed {
		panic("engine: CheckpointState after Close")
	}
	meta := e.checkpointMeta()
	st, err := checkpoint.NewState(e.layout, e.n, e.stage, checkpointAlignElems, meta.States)
	if err != nil {
		return nil, fmt.Errorf("engine: checkpoint: %w", err)
	}
	st.Step, st.Config = meta.Step, meta.Config
	resume, err := e.quiesce()
	defer resume()
	if err != nil {
		return nil, fmt.Errorf("engine: checkpoint: %w", err)
	}
	for c := range e.chunks {
		for k, spec := range st.States {
			per := len(st.Shard(0, c, k))
			whole := make([]byte, e.n*per)
			if err := e.fillChunk(c, spec.Kind, whole, per); err != nil {
				return nil, fmt.Errorf("engine: checkpoint: chunk %d %s: %w", c, spec.Kind, err)
			}
			for r := range e.n {
				copy(st.Shard(r, c, k), whole[r*per:(r+1)*per])
			}
		}
	}
	return st, nil
}

// SaveCheckpoint writes the training state as the newest checkpoint under
// dir and returns the checkpoint's directory. It streams
// (checkpoint.SaveStream): chunk by chunk, state by state, every rank's
// shard is copied from where it lives (device, host optimizer, tier store:
// host RAM or NVMe) into one of two host buffers while the other is
// written to the rank files, so host memory is two buffers of the largest
// chunk's f32 state across the ranks, whatever the model's size. The files
// are those of checkpoint.SaveWith: crash-safe, CRC-32C per file,
// dir/latest replaced last, opts.Keep checkpoints kept. In a job of
// several processes (Options.Procs) every process calls it, and each
// writes its own ranks' files into the one checkpoint (checkpoint.SaveJob:
// dir must be the same directory for all). Call it between steps, from the
// goroutine that runs them.
func (e *Engine) SaveCheckpoint(dir string, opts checkpoint.Options) (string, error) {
	if e.closed {
		panic("engine: SaveCheckpoint after Close")
	}
	meta := e.checkpointMeta()
	resume, err := e.quiesce()
	defer resume()
	if err != nil {
		return "", fmt.Errorf("engine: save step %d: %w", meta.Step, err)
	}
	if p := e.opts.Procs; p != nil {
		// Each process writes its ranks' files (checkpoint.SaveJob).
		err = checkpoint.SaveJob(dir, meta, e.base, e.base+e.nLocal, func(c, k int, part []byte) error {
			per := len(part) / e.nLocal
			return e.fillLocal(c, meta.States[k].Kind, func(r *rank) []byte { return part[r.loc*per : (r.loc+1)*per] })
		}, p, opts)
	} else {
		err = checkpoint.SaveStream(dir, meta, func(c, k int, whole []byte) error {
			per := len(whole) / e.n
			return e.fillChunk(c, meta.States[k].Kind, whole, per)
		}, opts)
	}
	if err != nil {
		return "", fmt.Errorf("engine: save step %d: %w", meta.Step, err)
	}
	path, err := checkpoint.Resolve(dir)
	if err != nil {
		return "", fmt.Errorf("engine: save step %d: %w", meta.Step, err)
	}
	return path, nil
}

// LoadCheckpoint restores the training state from the checkpoint at path (a
// checkpoint directory, or a directory whose "latest" names one). A
// checkpoint of another model shape or precision (of a library model:
// another name, or other chunks or tensors) is refused with an error
// naming both, before its files are read; then every file's size and
// CRC-32C is verified in a streaming pass, so a corrupt checkpoint
// restores nothing; then the state streams in chunk by chunk
// (checkpoint.Reader.Read: two host buffers of the largest chunk's f32
// state), resharded on the fly when it was saved on another device count.
// An I/O error in that last pass leaves the engine partly restored: do not
// train it. See RestoreState for the engines that may be restored.
func (e *Engine) LoadCheckpoint(path string) error {
	if e.closed {
		panic("engine: LoadCheckpoint after Close")
	}
	want := e.checkpointExpect()
	rd, err := checkpoint.OpenFor(path, want)
	if err != nil {
		return fmt.Errorf("engine: load checkpoint: %w", err)
	}
	defer rd.Close()
	if err := e.checkFreezeRestore(rd.State().Config, rd.State().Step); err != nil {
		return fmt.Errorf("engine: load checkpoint %s: %w", path, err)
	}
	if n := rd.State().ConversionNote(want); n != "" {
		e.notes = append(e.notes, n)
	}
	err = e.restore(rd.State().Step, rd.State().FP16, func() error {
		return rd.Read(want, func(c, k int, whole []byte) error {
			per := len(whole) / e.n
			shards := make([][]byte, e.n)
			for r := range shards {
				shards[r] = whole[r*per : (r+1)*per]
			}
			return e.restoreChunk(c, want.States[k].Kind, shards, whole)
		})
	})
	if err != nil {
		return fmt.Errorf("engine: load checkpoint: %w", err)
	}
	return nil
}

// RestoreState replaces the engine's params, master weights, Adam moments
// and step counter with st's (resharded when st was saved for another
// device count). The stage may differ from the one st was saved with: the
// files do not depend on it. An engine whose tier store moves shards
// (offload_param, NVMe offload) must not have run a step yet (its planners
// hold copies they consider current); others, ZeRO-Offload included (every
// state stays in its home in host RAM), may be restored at any point
// between steps.
func (e *Engine) RestoreState(st *checkpoint.State) error {
	if e.closed {
		panic("engine: RestoreState after Close")
	}
	if err := st.Validate(); err != nil {
		return fmt.Errorf("engine: restore: %w", err)
	}
	want := e.checkpointExpect()
	if err := st.Match(want); err != nil {
		return fmt.Errorf("engine: restore: %w", err)
	}
	if err := e.checkFreezeRestore(st.Config, st.Step); err != nil {
		return fmt.Errorf("engine: restore: %w", err)
	}
	if n := st.ConversionNote(want); n != "" || st.Devices != want.Devices || st.ShardAlignElems != want.ShardAlignElems {
		if n != "" {
			e.notes = append(e.notes, n)
		}
		var err error
		if st, err = st.Convert(want.Devices, want.ShardAlignElems, want.States); err != nil {
			return fmt.Errorf("engine: restore: %w", err)
		}
	}
	e.checkShards(st)
	err := e.restore(st.Step, st.FP16, func() error {
		for c := range e.chunks {
			for _, spec := range want.States {
				k := st.StateIndex(spec.Kind)
				shards := make([][]byte, e.n)
				for r := range shards {
					shards[r] = st.Shard(r, c, k)
				}
				if err := e.restoreChunk(c, spec.Kind, shards, nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("engine: restore: %w", err)
	}
	return nil
}

// restore is LoadCheckpoint and RestoreState: it checks that the engine
// may be restored, quiesces it, runs run (which restores every chunk and
// state with restoreChunk), then sets the step counter and takes the
// restore's copies off the next step's traffic.
func (e *Engine) restore(step int64, f16 *checkpoint.FP16, run func() error) error {
	if r, n, ok := e.tiers.moved(); ok {
		return fmt.Errorf("the tier store has served %d accesses of rank %d (a step ran); restore into a new engine", n, r)
	}
	resume, err := e.quiesce()
	defer resume()
	if err != nil {
		return err
	}
	if err := run(); err != nil {
		return err
	}
	e.step = step
	e.restoreFP16(f16)
	if err := e.restorePending(e.updates()); err != nil {
		return err
	}
	// The restore's copies are not the next step's traffic.
	e.lastCount = e.counters()
	e.tiers.markStepEnd()
	return nil
}

// checkShards panics when st's shard lengths are not the engine's: both
// follow ShardElems with the same alignment.
func (e *Engine) checkShards(st *checkpoint.State) {
	for c, p := range e.chunks {
		if st.Chunks[c].ShardElems != p.shard || st.Chunks[c].Elems != p.len {
			panic(fmt.Sprintf("engine: chunk %d: checkpoint shards of %d (chunk %d), the engine's %d (chunk %d)", c, st.Chunks[c].ShardElems, st.Chunks[c].Elems, p.shard, p.len))
		}
	}
}

// saveShard enqueues (device) or does (host, tier store) the copy of the
// rank's slice of chunk c in state s into dst. Device reads land at the
// rank's next sync.
func (r *rank) saveShard(c int, s shard.State, dst []byte) error {
	e, st := r.e, r.st
	sz := e.estimate.Options.StateDType(s).Bytes(e.chunks[c].shard) // m, v
	if s == shard.Master {
		sz = 4 * int64(e.chunks[c].shard) // fp32, whatever the store keeps (remainder.go)
	}
	switch s {
	case shard.Param:
		switch {
		case e.paramTiered(c):
			return r.saveTiered(tkey(c, r.loc, shard.Param), dst)
		case st.paramIsFull(c):
			r.readDevice(dst, st.paramFull(c), int64(r.idx)*int64(len(dst)))
		default:
			r.readDevice(dst, st.param[c], 0)
		}
		return nil
	case shard.Master, shard.AdamM, shard.AdamV:
		if int64(len(dst)) != sz {
			panic(fmt.Sprintf("engine: %s shard of chunk %d: %d bytes, want %d", s, c, len(dst), sz))
		}
		switch {
		case e.chunks[c].frozen:
			return r.saveFrozen(c, s, dst)
		case s == shard.Master && e.offload:
			return e.masters.save(r, c, dst)
		case e.offload:
			return r.saveTiered(tkey(c, r.loc, s), dst)
		case e.stage == 0: // the whole chunk, replicated: the rank's slice
			r.readDevice(dst, r.deviceOpt(c, s), int64(r.idx)*sz)
		default:
			r.readDevice(dst, r.deviceOpt(c, s), 0)
		}
		return nil
	}
	panic(fmt.Sprintf("engine: no %s in a checkpoint", s))
}

// restoreShard writes src, the rank's slice of chunk c in state s, where
// the engine keeps it; whole is the padded chunk (all ranks' slices) for
// a state the rank holds replicated. Device writes are enqueued on s and
// complete at the rank's next sync.
func (r *rank) restoreShard(c int, s shard.State, src []byte, whole []byte) error {
	e, st := r.e, r.st
	switch s {
	case shard.Param:
		switch {
		case e.paramCode(c) != 0:
			return nil // from the master: see below
		case e.paramTiered(c):
			return r.restoreTiered(tkey(c, r.loc, shard.Param), src)
		case st.paramIsFull(c):
			r.writeDevice(st.paramFull(c), whole)
		default:
			r.writeDevice(st.param[c], src)
		}
		if e.precision == gpu.F32 && e.offload && !e.chunks[c].frozen {
			return r.restoreTiered(tkey(c, r.loc, shard.Master), src) // fp32: the params are the master weights
		}
		return nil
	case shard.Master, shard.AdamM, shard.AdamV:
		switch {
		case e.paramCode(c) != 0 && s == shard.Master:
			// A coded base shard is quantized from the checkpoint's fp32
			// master (the decoded values of the run that saved it, whose
			// quantization gives its bytes back: internal/nf4's and
			// internal/absmax8's round trips).
			return r.restoreTiered(tkey(c, r.loc, shard.Param), quantize(e.paramCode(c), decode(src, gpu.F32)))
		case e.chunks[c].frozen:
			return nil // no optimizer state: the checkpoint's is not read (freeze.go)
		case s == shard.Master && e.offload:
			return e.masters.restore(r, c, src)
		case e.offload:
			return r.restoreTiered(tkey(c, r.loc, s), src)
		case e.stage == 0:
			r.writeDevice(r.deviceOpt(c, s), whole)
		default:
			r.writeDevice(r.deviceOpt(c, s), src)
		}
		return nil
	}
	panic(fmt.Sprintf("engine: no %s in a checkpoint", s))
}

// saveFrozen writes what a checkpoint holds of a frozen chunk's optimizer
// state (freeze.go): as master the rank's param slice widened to f32
// (exact), zeros as m and v.
func (r *rank) saveFrozen(c int, s shard.State, dst []byte) error {
	if s != shard.Master {
		clear(dst)
		return nil
	}
	if r.e.paramCode(c) != 0 { // the decoded values, unrounded
		v, err := r.codedValues(tkey(c, r.loc, shard.Param))
		if err != nil {
			return err
		}
		copy(dst, encode(v, gpu.F32))
		return nil
	}
	p := make([]byte, r.e.chunks[c].shard*r.e.precision.Size())
	if err := r.saveShard(c, shard.Param, p); err != nil {
		return err
	}
	if err := r.s.Synchronize(); err != nil { // the device read has landed
		return err
	}
	copy(dst, encode(decode(p, r.e.precision), gpu.F32))
	return nil
}

// deviceOpt is the device optimizer's buffer of state s of chunk c (the
// whole padded chunk at stage 0, else the rank's shard); bf16 mode only for
// the master.
func (r *rank) deviceOpt(c int, s shard.State) gpu.Buffer {
	var b gpu.Buffer
	switch s {
	case shard.Master:
		b = r.st.master[c]
	case shard.AdamM:
		b = r.st.m[c]
	case shard.AdamV:
		b = r.st.v[c]
	}
	if b == nil {
		panic(fmt.Sprintf("engine: rank %d chunk %d: no device %s", r.idx, c, s))
	}
	return b
}

// readDevice enqueues the copy of len(dst) bytes of b from offBytes.
func (r *rank) readDevice(dst []byte, b gpu.Buffer, offBytes int64) {
	r.dev.CopyDeviceToHost(r.s, dst, b, offBytes)
}

// writeDevice enqueues the copy of src over the whole of b.
func (r *rank) writeDevice(b gpu.Buffer, src []byte) {
	if int64(len(src)) != b.Bytes() {
		panic(fmt.Sprintf("engine: rank %d: restore %d bytes into a buffer of %d", r.idx, len(src), b.Bytes()))
	}
	r.dev.CopyHostToDevice(r.s, b, 0, src)
}

// saveTiered copies the newest contents of a tier-store state into dst
// (the runners are paused; a streaming save allocates nothing per shard).
func (r *rank) saveTiered(k shard.Key, dst []byte) error {
	if k.State == shard.Param && r.e.paramCode(int(k.Chunk)) != 0 {
		v, err := r.codedValues(k)
		if err != nil {
			return err
		}
		copy(dst, encode(v, r.e.precision))
		return nil
	}
	return r.e.tiers.store.ReadNewest(k, dst)
}

// codedValues are a coded param shard's values (strata.lora.base_dtype
// "nf4" or "int8"): its stored bytes decoded to fp32, as the device decodes
// them before rounding to the params' dtype.
func (r *rank) codedValues(k shard.Key) ([]float32, error) {
	q, err := r.e.tiers.readShard(k)
	if err != nil {
		return nil, err
	}
	v := make([]float32, r.e.chunks[k.Chunk].shard)
	dequantize(r.e.paramCode(int(k.Chunk)), v, q)
	return v, nil
}

// restoreTiered writes src as the newest contents of a tier-store state
// and leaves it where New's initialisation leaves it: in its home only. The
// planners have not run, or never move anything (restore checks), so their
// picture, every state in its home, stays true.
func (r *rank) restoreTiered(k shard.Key, src []byte) error {
	return r.e.tiers.store.WriteHome(k, src)
}

// MasterChunks hands fn the fp32 master weights (what Master returns: in
// fp32 mode the params) one chunk at a time, chunks in order: data is
// chunk c's elements, every rank's shard copied from where it lives
// (device, host optimizer, tier store: host RAM or NVMe) side by side, as
// SaveCheckpoint copies them. data is reused after fn returns: keep no
// reference to it. Host memory: one buffer of the largest padded chunk in
// f32 (N × its shard), whatever the model's size; Master holds 4Ψ. Call it
// between steps, from the goroutine that runs them; fn's error is
// returned as is.
func (e *Engine) MasterChunks(fn func(c int, data []float32) error) error {
	if e.closed {
		panic("engine: MasterChunks after Close")
	}
	s := shard.Master
	if e.precision == gpu.F32 {
		s = shard.Param // the params are the master weights
	}
	resume, err := e.quiesce()
	defer resume()
	if err != nil {
		return fmt.Errorf("engine: master weights: %w", err)
	}
	maxShard := 0
	for _, p := range e.chunks {
		maxShard = max(maxShard, p.shard)
	}
	buf := make([]byte, 4*e.n*maxShard)
	for c, p := range e.chunks {
		per := 4 * p.shard
		whole := buf[:e.n*per]
		if err := e.fillChunk(c, s, whole, per); err != nil {
			return fmt.Errorf("engine: master weights: chunk %d: %w", c, err)
		}
		if err := fn(c, f32s(whole[:4*p.len])); err != nil {
			return err
		}
	}
	return nil
}
