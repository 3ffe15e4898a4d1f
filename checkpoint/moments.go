package checkpoint

import (
	"fmt"
	"strings"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/shard"
)

// Adam's moments are kept in the precision the run stored them in
// (strata.optimizer_state.moments): adam_m and adam_v are f32, bf16 or q8
// (dtype.Q8: cpuadam's int8 codes with a scale per block of 256, a
// shard's own; in the rank file a U8 tensor of dtype.Q8.Bytes(ShardElems)
// bytes). A checkpoint read by a run with another precision or another
// device count converts them through fp32 (convertible, Conversions).

// shardBytes is the size of one shard of n elements of s.
func shardBytes(s StateSpec, n int) int { return int(s.DType.Bytes(n)) }

// fileTensor is the dtype and length of a shard of n elements of s in a
// rank file.
func fileTensor(s StateSpec, n int) (dtype.DType, int64) {
	if s.DType == dtype.Q8 {
		return dtype.U8, s.DType.Bytes(n)
	}
	return s.DType, int64(n)
}

// isMoment reports whether a state of kind k may be stored and converted
// in any moments precision.
func isMoment(k shard.State) bool { return k == shard.AdamM || k == shard.AdamV }

// convertible reports whether a saved state have can be read as want.
func convertible(have, want StateSpec) bool {
	_, e1 := cpuadam.MomentsOf(have.DType)
	_, e2 := cpuadam.MomentsOf(want.DType)
	return have.Kind == want.Kind && isMoment(have.Kind) && e1 == nil && e2 == nil
}

// needsConversion reports whether reading have as want, from shards of
// haveElems into shards of wantElems, goes through fp32: another dtype,
// or a Q8 state resharded (its blocks are the shard's).
func needsConversion(have, want StateSpec, haveElems, wantElems int) bool {
	return have.DType != want.DType || have.DType == dtype.Q8 && haveElems != wantElems
}

// momentView is a moment shard of n elements of s over b.
func momentView(s StateSpec, n int, b []byte) cpuadam.Moment {
	m, err := cpuadam.MomentsOf(s.DType)
	if err != nil {
		panic(fmt.Sprintf("checkpoint: %v is not a moments state", s))
	}
	return m.View(n, b, s.Kind == shard.AdamV)
}

// convertChunk rewrites one chunk of a moment state: from shards of
// fromElems in from.DType, side by side in src, to shards of toElems in
// to.DType, side by side in dst, through the chunk's elems values in fp32
// (bf16 and f32 exactly; q8 decoded and encoded again, each block from its
// new largest |x|). The padding of dst is zero.
func convertChunk(from, to StateSpec, fromElems, toElems, fromDevices, toDevices, elems int, src, dst []byte) {
	vals := make([]float32, fromDevices*fromElems)
	per := shardBytes(from, fromElems)
	for r := range fromDevices {
		momentView(from, fromElems, src[r*per:(r+1)*per]).Decode(vals[r*fromElems : (r+1)*fromElems])
	}
	vals = vals[:elems]
	out := make([]float32, toElems)
	per = shardBytes(to, toElems)
	for r := range toDevices {
		clear(out)
		if lo := r * toElems; lo < elems {
			copy(out, vals[lo:min(lo+toElems, elems)])
		}
		momentView(to, toElems, dst[r*per:(r+1)*per]).Encode(out)
	}
}

// ConversionNote is the note a run restoring st for e prints when it
// converts the moments' precision, "" when it converts nothing.
func (st *State) ConversionNote(e Expect) string {
	if conv := st.Conversions(e); len(conv) > 0 {
		return fmt.Sprintf("checkpoint: %s: the optimizer state was saved in another precision and is converted (rounded again: not the run it continues bit for bit)", strings.Join(conv, ", "))
	}
	return ""
}

// Conversions lists the states a read for e converts (another moments
// precision): "adam_m q8 → bf16", empty when none.
func (st *State) Conversions(e Expect) []string {
	var out []string
	for _, want := range e.States {
		if k := st.StateIndex(want.Kind); k >= 0 && st.States[k].DType != want.DType {
			out = append(out, fmt.Sprintf("%s %v → %v", want.Kind, st.States[k].DType, want.DType))
		}
	}
	return out
}
