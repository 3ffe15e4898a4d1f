package checkpoint

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/shard"
)

// TestInt8ScalesChecked: int8 moments whose block scales are NaN, Inf,
// negative, absurd (an m of 2^100) or at odds with their codes (a zero
// scale over nonzero codes, codes whose largest is not 1.0's) are refused
// at load naming the rank file, the tensor and the block, though the
// file's CRC is valid (the save wrote them so); the same state with the
// scales the encoder wrote loads.
func TestInt8ScalesChecked(t *testing.T) {
	q8 := AdamStates(dtype.BF16, dtype.Q8)
	build := func(t *testing.T) *State {
		st, err := NewState(tinyLayout(t), 2, 3, 64, q8)
		if err != nil {
			t.Fatal(err)
		}
		st.Step = 5
		st.Config = []byte(`{}`)
		rng := rand.New(rand.NewPCG(3, 4))
		for c, ch := range st.Chunks {
			for k, s := range st.States {
				if !isMoment(s.Kind) {
					continue
				}
				vals := make([]float32, ch.ShardElems)
				for r := range st.Devices {
					for i := range vals {
						vals[i] = float32(rng.NormFloat64() * 1e-3)
						if s.Kind == shard.AdamV {
							vals[i] *= vals[i]
						}
					}
					momentView(s, ch.ShardElems, st.Shard(r, c, k)).Encode(vals)
				}
			}
		}
		return st
	}
	// The first chunk whose moments are int8 (a shard of 4096 elements or more).
	big := -1
	probe := build(t)
	for c, ch := range probe.Chunks {
		if cpuadam.MomentsInt8.For(ch.ShardElems) == cpuadam.MomentsInt8 {
			big = c
			break
		}
	}
	if big < 0 {
		t.Fatal("no chunk of the tiny layout has int8 moments")
	}
	dir := t.TempDir()
	if err := Save(dir, probe); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatalf("the encoder's int8 moments: %v", err)
	}
	sameState(t, got, probe)

	setScale := func(b []byte, block int, f float32) {
		binary.LittleEndian.PutUint32(b[4*block:], math.Float32bits(f))
	}
	for _, c := range []struct {
		name string
		kind shard.State
		edit func(b []byte, nb int)
		want string
	}{
		{"nan", shard.AdamM, func(b []byte, _ int) { setScale(b, 1, float32(math.NaN())) }, "int8 m block 1 (elements 256-511): scale NaN is not finite"},
		{"inf", shard.AdamV, func(b []byte, _ int) { setScale(b, 0, float32(math.Inf(1))) }, "int8 v block 0 (elements 0-255): scale +Inf is not finite"},
		{"negative", shard.AdamV, func(b []byte, _ int) { setScale(b, 2, -1e-6) }, "int8 v block 2 (elements 512-767): scale -1e-06 is negative"},
		{"absurd", shard.AdamM, func(b []byte, _ int) { setScale(b, 0, 0x1p100) }, "int8 m block 0 (elements 0-255): scale 1.2676506e+30 is above 2^80"},
		{"zero-scale", shard.AdamM, func(b []byte, _ int) { setScale(b, 3, 0) }, "int8 m block 3 (elements 768-1023): scale 0 with nonzero codes"},
		{"codes", shard.AdamV, func(b []byte, nb int) {
			codes := b[4*nb:]
			for i := range cpuadam.QuantBlock {
				codes[i] = 0x40 // a block without 1.0's code 0xf8
			}
		}, "int8 v block 0 (elements 0-255): scale"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := build(t)
			k := st.StateIndex(c.kind)
			nb := (st.Chunks[big].ShardElems + cpuadam.QuantBlock - 1) / cpuadam.QuantBlock
			c.edit(st.Shard(1, big, k), nb)
			dir := t.TempDir()
			if err := Save(dir, st); err != nil {
				t.Fatal(err)
			}
			_, err := Load(dir)
			wantFile := "rank-00001.safetensors: tensor " + tensorName(big, c.kind) + ": "
			if err == nil || !strings.Contains(err.Error(), wantFile+c.want) {
				t.Fatalf("got %v\nwant %q", err, wantFile+c.want)
			}
			// Read with another device count converts the moments: checked all the same.
			if _, err := LoadFor(dir, Expect{Shape: st.Shape, Chunks: LayoutChunks(tinyLayout(t), 1, 64), Devices: 1, ShardAlignElems: 64, States: st.States}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("resharded: got %v, want %q", err, c.want)
			}
		})
	}
}
