package checkpoint

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/lossscale"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// StateSpec is one state kept for every chunk shard, and its dtype: param
// bf16 (or f32 in fp32 mode), master, adam_m and adam_v f32.
type StateSpec struct {
	Kind  shard.State
	DType dtype.DType
}

func (s StateSpec) String() string { return s.Kind.String() + " " + s.DType.String() }

// MixedPrecisionStates are the states of mixed-precision Adam: bf16 params,
// fp32 master weights and moments.
var MixedPrecisionStates = AdamStates(dtype.BF16, dtype.F32)

// AdamStates are the states of Adam with params in dtype params and its
// moments in dtype moments (f32, bf16 or q8): bf16 or f16 params (mixed
// precision) and fp32 master weights, or with f32 params the params
// themselves as the master.
func AdamStates(params, moments dtype.DType) []StateSpec {
	if params == dtype.F32 {
		return []StateSpec{{shard.Param, dtype.F32}, {shard.AdamM, moments}, {shard.AdamV, moments}}
	}
	return []StateSpec{{shard.Param, params}, {shard.Master, dtype.F32}, {shard.AdamM, moments}, {shard.AdamV, moments}}
}

// ChunkInfo is one chunk of the layout as the checkpoint shards it.
type ChunkInfo struct {
	Name       string `json:"name"`
	Elems      int    `json:"elems"`       // the chunk's parameters (model.Chunk.Len)
	ShardElems int    `json:"shard_elems"` // each rank's slice; the padded chunk is Devices·ShardElems
	// Tensors are the chunk's tensors in layout order, for a custom
	// model's checkpoint (State.Model) only: its layout (custom.go).
	Tensors []ChunkTensor `json:"tensors,omitempty"`
}

// State is a training checkpoint as plain data, so that the engine can fill
// it and read it without this package knowing the engine.
//
// Whatever the ZeRO stage, rank r's shard of a chunk is elements
// [r·S, (r+1)·S) of the chunk zero-padded to Devices·S, S =
// Chunks[c].ShardElems: a state the engine keeps replicated (params at
// stages 0-2, everything at stage 0) is saved as each rank's slice of its
// copy, and Gather rebuilds the whole chunk. So the files do not depend on
// the stage and a checkpoint can be resharded to another device count.
type State struct {
	Step    int64
	Devices int
	Stage   int
	Shape   model.Shape
	// Model names a model defined outside package model (a custom
	// layout, custom.go); Shape is then zero and every chunk lists its
	// tensors. Empty for the decoders of package model.
	Model string
	// LoRA is the adapters of a decoder trained with LoRA (nil: none):
	// their chunks follow the base's (model.Layout.WithLoRA).
	LoRA *model.LoRA
	// FP16 is an fp16 run's loss scaling at Step (nil: not fp16).
	FP16            *FP16
	ShardAlignElems int
	Config          []byte // the run's configuration, JSON (stored compacted); may be empty
	Chunks          []ChunkInfo
	States          []StateSpec
	// Data[r][c][k] is rank r's shard of chunk c in state States[k]:
	// Chunks[c].ShardElems · States[k].DType.Size() bytes, little-endian.
	Data [][][][]byte
}

// FP16 is an fp16 run's loss scaling at a checkpoint's step: the
// scaler's state (the scale the next step runs with, DeepSpeed's
// cur_iter, last_overflow_iter and cur_hysteresis) and the steps skipped
// for an overflow so far. The optimizer's step count (Adam's bias
// correction, the learning-rate schedule) is Step − SkippedSteps.
type FP16 struct {
	Scaler       lossscale.State `json:"scaler"`
	SkippedSteps int64           `json:"skipped_steps"`
}

// ShardElems is each rank's slice of a chunk of chunkElems elements over
// devices ranks: ceil(chunkElems/devices) rounded up to alignElems, the
// same rule as engine.ShardElems.
func ShardElems(chunkElems, devices, alignElems int) int {
	if chunkElems < 0 || devices < 1 || alignElems < 1 {
		panic(fmt.Sprintf("checkpoint: ShardElems(%d, %d, %d): bad arguments", chunkElems, devices, alignElems))
	}
	per := (chunkElems + devices - 1) / devices
	return (per + alignElems - 1) / alignElems * alignElems
}

// NewState returns a State for layout l sharded over devices ranks with
// zeroed shards of every state, ready to be filled (Shard).
func NewState(l *model.Layout, devices, stage, alignElems int, states []StateSpec) (*State, error) {
	if devices < 1 || alignElems < 1 {
		return nil, fmt.Errorf("checkpoint: devices %d and shard alignment %d must be >= 1", devices, alignElems)
	}
	st := &State{Devices: devices, Stage: stage, Shape: l.Shape, LoRA: l.LoRA, ShardAlignElems: alignElems,
		States: append([]StateSpec(nil), states...), Chunks: LayoutChunks(l, devices, alignElems)}
	if l.Custom() {
		st.Model = l.Name
	}
	st.Data = st.alloc()
	if err := st.Validate(); err != nil {
		return nil, err
	}
	return st, nil
}

func (st *State) alloc() [][][][]byte {
	data := make([][][][]byte, st.Devices)
	for r := range data {
		data[r] = make([][][]byte, len(st.Chunks))
		for c, ch := range st.Chunks {
			data[r][c] = make([][]byte, len(st.States))
			for k, s := range st.States {
				data[r][c][k] = make([]byte, shardBytes(s, ch.ShardElems))
			}
		}
	}
	return data
}

// StateIndex is the index in States of kind, or -1.
func (st *State) StateIndex(kind shard.State) int {
	for k, s := range st.States {
		if s.Kind == kind {
			return k
		}
	}
	return -1
}

// Shard is rank r's shard of chunk c in state States[k] (Data[r][c][k]).
func (st *State) Shard(r, c, k int) []byte { return st.Data[r][c][k] }

// Validate checks that the State is consistent: a valid shape (or a custom
// model's name and tensors) whose layout has exactly Chunks, shard lengths that cover each chunk, known states
// without repeats, and Data of the right sizes.
func (st *State) Validate() error {
	if err := st.validateMeta(); err != nil {
		return err
	}
	return st.validateData()
}

// validateMeta is Validate without Data: what a streaming save
// (SaveStream) needs of its description.
func (st *State) validateMeta() error {
	switch {
	case st.Step < 0:
		return fmt.Errorf("checkpoint: step %d is negative", st.Step)
	case st.Devices < 1:
		return fmt.Errorf("checkpoint: devices %d must be >= 1", st.Devices)
	case st.Stage < 0 || st.Stage > 3:
		return fmt.Errorf("checkpoint: ZeRO stage %d is not 0-3", st.Stage)
	case st.ShardAlignElems < 1:
		return fmt.Errorf("checkpoint: shard alignment %d must be >= 1", st.ShardAlignElems)
	case len(st.Config) > 0 && !json.Valid(st.Config):
		return fmt.Errorf("checkpoint: config is not valid JSON")
	}
	l, err := st.Layout()
	if err != nil {
		return err
	}
	if len(st.Chunks) != len(l.Chunks) {
		return fmt.Errorf("checkpoint: %d chunks, the layout of %s has %d", len(st.Chunks), l.Name, len(l.Chunks))
	}
	for c, ch := range st.Chunks {
		if ch.Elems != l.Chunks[c].Len {
			return fmt.Errorf("checkpoint: chunk %d (%s) has %d elements, the layout has %d", c, ch.Name, ch.Elems, l.Chunks[c].Len)
		}
		if ch.ShardElems < 0 || ch.ShardElems*st.Devices < ch.Elems {
			return fmt.Errorf("checkpoint: chunk %d: %d ranks of %d elements do not cover its %d", c, st.Devices, ch.ShardElems, ch.Elems)
		}
	}
	seen := map[shard.State]bool{}
	for _, s := range st.States {
		if int(s.Kind) >= shard.StateCount || seen[s.Kind] {
			return fmt.Errorf("checkpoint: state %v unknown or repeated", s.Kind)
		}
		seen[s.Kind] = true
		if s.DType != dtype.F32 && s.DType != dtype.BF16 && !(s.DType == dtype.F16 && s.Kind == shard.Param) && !(s.DType == dtype.Q8 && isMoment(s.Kind)) {
			return fmt.Errorf("checkpoint: state %v has dtype %v (want f32 or bf16; f16 for params; q8 for adam_m and adam_v)", s.Kind, s.DType)
		}
	}
	return nil
}

func (st *State) validateData() error {
	if len(st.Data) != st.Devices {
		return fmt.Errorf("checkpoint: data for %d ranks, devices %d", len(st.Data), st.Devices)
	}
	for r := range st.Data {
		if len(st.Data[r]) != len(st.Chunks) {
			return fmt.Errorf("checkpoint: rank %d has data for %d chunks, want %d", r, len(st.Data[r]), len(st.Chunks))
		}
		for c, ch := range st.Chunks {
			if len(st.Data[r][c]) != len(st.States) {
				return fmt.Errorf("checkpoint: rank %d chunk %d has %d states, want %d", r, c, len(st.Data[r][c]), len(st.States))
			}
			for k, s := range st.States {
				if want := shardBytes(s, ch.ShardElems); len(st.Data[r][c][k]) != want {
					return fmt.Errorf("checkpoint: rank %d chunk %d %v: %d bytes, want %d", r, c, s.Kind, len(st.Data[r][c][k]), want)
				}
			}
		}
	}
	return nil
}

// Gather returns chunk c of state States[k] whole: the ranks' shards in
// rank order without the padding, Chunks[c].Elems elements (a q8 state:
// every shard as stored, padding included).
func (st *State) Gather(c, k int) []byte {
	if st.States[k].DType == dtype.Q8 { // blocks are the shards': all of them, as stored
		var out []byte
		for r := range st.Devices {
			out = append(out, st.Data[r][c][k]...)
		}
		return out
	}
	sz := st.States[k].DType.Size()
	out := make([]byte, 0, st.Chunks[c].Elems*sz)
	rest := st.Chunks[c].Elems * sz
	for r := 0; r < st.Devices && rest > 0; r++ {
		b := st.Data[r][c][k]
		n := min(len(b), rest)
		out = append(out, b[:n]...)
		rest -= n
	}
	return out
}

// Reshard returns the State split over devices ranks with shard alignment
// alignElems: every chunk of every state gathered from the old ranks and
// split again, the new padding zero. The values do not change, except
// that a q8 state's blocks are the new shards' (convertChunk).
func (st *State) Reshard(devices, alignElems int) (*State, error) {
	return st.Convert(devices, alignElems, st.States)
}

// Convert is Reshard that also stores each state in states' dtype (the
// same kinds as st's, in any order; a moments state may change precision:
// Conversions).
func (st *State) Convert(devices, alignElems int, states []StateSpec) (*State, error) {
	if devices < 1 || alignElems < 1 {
		return nil, fmt.Errorf("checkpoint: reshard to %d devices with alignment %d", devices, alignElems)
	}
	out := *st
	out.Devices, out.ShardAlignElems, out.States = devices, alignElems, states
	out.Chunks = make([]ChunkInfo, len(st.Chunks))
	for c, ch := range st.Chunks {
		ch.ShardElems = ShardElems(ch.Elems, devices, alignElems)
		out.Chunks[c] = ch
	}
	out.Data = out.alloc()
	for c, ch := range out.Chunks {
		for k, s := range states {
			from := st.StateIndex(s.Kind)
			if from < 0 || st.States[from].DType != s.DType && !convertible(st.States[from], s) {
				return nil, fmt.Errorf("checkpoint: holds %s, not %v", specList(st.States), s)
			}
			if needsConversion(st.States[from], s, st.Chunks[c].ShardElems, ch.ShardElems) {
				var src, dst []byte
				for r := range st.Devices {
					src = append(src, st.Data[r][c][from]...)
				}
				dst = make([]byte, devices*shardBytes(s, ch.ShardElems))
				convertChunk(st.States[from], s, st.Chunks[c].ShardElems, ch.ShardElems, st.Devices, devices, ch.Elems, src, dst)
				per := shardBytes(s, ch.ShardElems)
				for r := range devices {
					copy(out.Data[r][c][k], dst[r*per:])
				}
				continue
			}
			full := st.Gather(c, from)
			per := ch.ShardElems * s.DType.Size()
			for r := range devices {
				lo := min(r*per, len(full))
				copy(out.Data[r][c][k], full[lo:min(lo+per, len(full))])
			}
		}
	}
	return &out, nil
}

// Expect is what a run needs of a checkpoint: LoadFor refuses one saved for
// another shape or model or without the run's states, and reshards one
// saved for another device count or alignment.
type Expect struct {
	Shape model.Shape
	// Model and Chunks describe a custom model instead of Shape (as in
	// State: ExpectLayout fills them): the checkpoint must have its name
	// and every chunk's length and tensors. ShardElems are not compared.
	Model           string
	Chunks          []ChunkInfo
	LoRA            *model.LoRA // the run's adapters (nil: none); a checkpoint must have the same
	Devices         int
	ShardAlignElems int
	States          []StateSpec
}

// Match says why st cannot serve the run e (nil when it can, perhaps after
// Reshard).
func (st *State) Match(e Expect) error {
	if err := st.matchModel(e); err != nil {
		return err
	}
	if a, b := st.Shape, e.Shape; st.Model == "" && a.Canonical() != b.Canonical() {
		return fmt.Errorf("checkpoint: saved for shape %s, this run is %s; a checkpoint cannot change the model's shape (export the weights and import them instead)", a, b)
	}
	if err := matchLoRA(st.LoRA, e.LoRA); err != nil {
		return err
	}
	for _, want := range e.States {
		k := st.StateIndex(want.Kind)
		if k >= 0 && want.Kind == shard.Param && st.States[k].DType != want.DType && st.States[k].DType.Half() && want.DType.Half() {
			return fmt.Errorf("checkpoint: saved in %s mixed precision, this run trains in %s: a checkpoint resumes in the precision it was saved in (bf16 and fp16 round the params differently); keep its bf16/fp16 block, or start a new run from its weights (--init)", st.States[k].DType, want.DType)
		}
		if k < 0 || st.States[k].DType != want.DType && !convertible(st.States[k], want) {
			return fmt.Errorf("checkpoint: holds %s, the run needs %s (was it saved with another precision?)", specList(st.States), specList(e.States))
		}
	}
	return nil
}

// matchLoRA says why a checkpoint with adapters saved cannot serve a run
// with adapters run (nil when both have none, or the same).
func matchLoRA(saved, run *model.LoRA) error {
	switch {
	case saved == nil && run == nil:
		return nil
	case saved == nil:
		return fmt.Errorf("checkpoint: saved without LoRA, this run trains LoRA adapters (strata.lora): start the LoRA run from the weights instead (strata export, then --init)")
	case run == nil:
		return fmt.Errorf("checkpoint: saved with LoRA adapters (r %d, %s), this run has no strata.lora: keep the run's strata.lora, or export the merged model (strata export --merge) and train from it", saved.R, strings.Join(saved.Targets, ", "))
	}
	a, _ := json.Marshal(saved)
	b, _ := json.Marshal(run)
	if string(a) != string(b) {
		return fmt.Errorf("checkpoint: saved with LoRA %s, this run's strata.lora is %s: the adapters' shape and scaling cannot change on resume", a, b)
	}
	return nil
}

func specList(s []StateSpec) string {
	var parts []string
	for _, x := range s {
		parts = append(parts, x.String())
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
