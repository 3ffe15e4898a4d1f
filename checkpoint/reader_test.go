package checkpoint

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/shard"
)

// TestReaderReadChunk checks a training checkpoint's weights read one
// chunk at a time (the source of `strata train --init` from a Strata
// checkpoint): the fp32 master weights of every rank's shard, padding
// dropped, over 3 ranks with padded shards; a checkpoint without master
// weights gives its bf16 params widened.
func TestReaderReadChunk(t *testing.T) {
	st := filledState(t, 3, 64, 9)
	dir := t.TempDir()
	if err := SaveWith(dir, st, Options{Source: &hf.Source{Path: "/models/x", Format: hf.SourceHF, Tokenizer: []string{"tokenizer.json"}}}); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.Source().TokenizerPath() != "/models/x/tokenizer.json" || rd.Shape().Canonical() != st.Shape.Canonical() {
		t.Errorf("source %+v, shape %v", rd.Source(), rd.Shape())
	}
	k := st.StateIndex(shard.Master)
	for c, ch := range st.Chunks {
		got := make([]float32, ch.Elems)
		if err := rd.ReadChunk(c, got); err != nil {
			t.Fatal(err)
		}
		want := dtype.Float32s(st.Gather(c, k)[:4*ch.Elems])
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("chunk %d element %d: %#08x, the master shard holds %#08x", c, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}
	// Params only (bf16).
	p, err := NewState(tinyLayout(t), 2, 3, 64, []StateSpec{{Kind: shard.Param, DType: dtype.BF16}})
	if err != nil {
		t.Fatal(err)
	}
	for c, ch := range p.Chunks {
		for r := range 2 {
			b := p.Shard(r, c, 0)
			for i := 0; i < len(b); i += 2 {
				if r*ch.ShardElems+i/2 < ch.Elems {
					binary.LittleEndian.PutUint16(b[i:], uint16(0x3f80+c+i/2%7))
				}
			}
		}
	}
	pdir := t.TempDir()
	if err := Save(pdir, p); err != nil {
		t.Fatal(err)
	}
	prd, err := Open(pdir)
	if err != nil {
		t.Fatal(err)
	}
	defer prd.Close()
	if prd.Source() != nil {
		t.Errorf("a checkpoint saved without a source has %+v", prd.Source())
	}
	for c, ch := range p.Chunks {
		got := make([]float32, ch.Elems)
		if err := prd.ReadChunk(c, got); err != nil {
			t.Fatal(err)
		}
		whole := p.Gather(c, 0)
		for i := range got {
			if want := math.Float32frombits(uint32(binary.LittleEndian.Uint16(whole[2*i:])) << 16); got[i] != want {
				t.Fatalf("params chunk %d element %d: %v, want %v", c, i, got[i], want)
			}
		}
	}
}
