package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

func tinyLayout(t testing.TB) *model.Layout {
	t.Helper()
	s, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func sameFile(t *testing.T, what, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		i := 0
		for i < min(len(x), len(y)) && x[i] == y[i] {
			i++
		}
		t.Errorf("%s: %d bytes vs %d, first difference at byte %d", what, len(x), len(y), i)
	}
}

// exportStateLegacy is ExportState before streaming: the whole checkpoint
// loaded, the exported state gathered chunk by chunk, the whole-model
// export (hf.Export, which package hf's TestExportStreamSameBytes holds to
// the element-by-element encoding of before ExportStream).
func exportStateLegacy(t *testing.T, dst, src string, opts hf.ExportOptions) {
	t.Helper()
	st, err := Load(src)
	if err != nil {
		t.Fatal(err)
	}
	l, err := model.NewLayout(st.Shape)
	if err != nil {
		t.Fatal(err)
	}
	k := st.StateIndex(shard.Master)
	if k < 0 {
		k = st.StateIndex(shard.Param)
	}
	if opts.Step == 0 {
		opts.Step = st.Step
	}
	var f32 [][]float32
	var b16 [][]uint16
	for c := range st.Chunks {
		if st.States[k].DType == dtype.BF16 {
			b16 = append(b16, dtype.Uint16s(st.Gather(c, k)))
		} else {
			f32 = append(f32, dtype.Float32s(st.Gather(c, k)))
		}
	}
	if b16 != nil {
		err = hf.Export(dst, l, b16, opts)
	} else {
		err = hf.Export(dst, l, f32, opts)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// fillWeights writes chunk c's weights (l.InitChunk's, the same for every
// device count; another seed per state) into the whole of states[k].
func fillWeights(l *model.Layout, states []StateSpec) ChunkFunc {
	return func(c, k int, whole []byte) error {
		v := l.InitChunk(uint64(3+k), c)
		if states[k].DType == dtype.BF16 {
			h := make([]uint16, len(v))
			bf16.FromFloat32s(h, v)
			copy(whole[:2*len(v)], dtype.Bytes(h))
			return nil
		}
		copy(whole[:4*len(v)], dtype.Bytes(v))
		return nil
	}
}

// TestExportCheckpointSameBytes: the streaming ExportCheckpoint writes the
// file that loading the whole checkpoint and exporting it wrote, byte for
// byte: the master weights of a mixed-precision checkpoint, the bf16 or
// fp32 params of one without, on 1 and 3 devices (padded shards), under
// both namings and in both dtypes.
func TestExportCheckpointSameBytes(t *testing.T) {
	l := tinyLayout(t)
	for _, states := range [][]StateSpec{
		MixedPrecisionStates,
		{{Kind: shard.Param, DType: dtype.BF16}},
		{{Kind: shard.Param, DType: dtype.F32}, {Kind: shard.AdamM, DType: dtype.F32}, {Kind: shard.AdamV, DType: dtype.F32}},
	} {
		for _, devices := range []int{1, 3} {
			meta, err := NewState(l, devices, 3, 8, states)
			if err != nil {
				t.Fatal(err)
			}
			meta = meta.Meta()
			meta.Step = 9
			src := t.TempDir()
			if err := SaveStream(src, meta, fillWeights(l, states), Options{}); err != nil {
				t.Fatal(err)
			}
			for _, names := range []hf.Naming{hf.NamesStrata, hf.NamesHF} {
				for _, dt := range []dtype.DType{dtype.F32, dtype.BF16} {
					what := fmt.Sprintf("%s on %d devices, %s names, %v file", specList(states), devices, names, dt)
					dir := t.TempDir()
					got, want := filepath.Join(dir, "got"), filepath.Join(dir, "want")
					opts := hf.ExportOptions{Names: names, DType: dt}
					st, err := ExportCheckpoint(context.Background(), got, src, opts)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if st.Step != 9 || st.Devices != devices {
						t.Errorf("%s: returned step %d, %d devices", what, st.Step, st.Devices)
					}
					exportStateLegacy(t, want, src, opts)
					sameFile(t, what, got, want)
					if names == hf.NamesStrata && dt == dtype.F32 {
						other := filepath.Join(dir, "state")
						full, err := Load(src)
						if err != nil {
							t.Fatal(err)
						}
						if err := ExportState(other, full, opts); err != nil {
							t.Fatal(err)
						}
						sameFile(t, what+" (ExportState)", got, other)
					}
				}
			}
		}
	}
	// Neither master weights nor params: the error ExportState gives.
	meta, _ := NewState(l, 1, 3, 8, []StateSpec{{Kind: shard.AdamM, DType: dtype.F32}})
	src := t.TempDir()
	if err := SaveStream(src, meta.Meta(), fillWeights(l, meta.States), Options{}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "m")
	if _, err := ExportCheckpoint(context.Background(), dst, src, hf.ExportOptions{}); err == nil || !strings.Contains(err.Error(), "holds neither master weights nor params") {
		t.Errorf("export of a checkpoint without weights: %v", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("export of a checkpoint without weights wrote %s (%v)", dst, err)
	}
}

// TestExportCheckpointMemoryBound is the must-show of the bound: exporting
// a model of 7M parameters (28 MB of fp32 weights in 66 chunks, 770 tensors)
// allocates on the heap, in all (the Go runtime's count of every byte
// allocated while it runs, not just the live peak):
//   - from a checkpoint (ExportCheckpoint): at most the Reader's two
//     buffers of the largest padded chunk of master weights (0.44 MB),
//     256 KiB per rank file for the CRC pass, the largest tensor (0.15 MB),
//     the 1 MiB write buffer, 2 KiB per tensor for the header and its
//     bookkeeping (names, shapes, the layout; they grow with the number of
//     tensors, not their size) and 512 KiB for the rest: 4.7 MB, a sixth
//     of the weights (package hf's TestExportStreamMemoryBound holds
//     ExportStream alone to its part).
//
// The file is then compared with the whole-model export's.
func TestExportCheckpointMemoryBound(t *testing.T) {
	l, err := model.NewLayout(model.Shape{Name: "bound", Layers: 64, Dim: 96, Heads: 4, Vocab: 64, MaxSeq: 16})
	if err != nil {
		t.Fatal(err)
	}
	const devices = 2
	states := []StateSpec{{Kind: shard.Master, DType: dtype.F32}}
	meta, err := NewState(l, devices, 3, 2048, states)
	if err != nil {
		t.Fatal(err)
	}
	meta = meta.Meta()
	src := t.TempDir()
	if err := SaveStream(src, meta, fillWeights(l, states), Options{}); err != nil {
		t.Fatal(err)
	}
	weights := 4 * l.ParamCount()
	tensor := 0
	for _, ch := range l.Chunks {
		for _, ts := range ch.Tensors {
			tensor = max(tensor, 4*ts.Len)
		}
	}
	const writeBuf = 1 << 20
	overhead := 512<<10 + 2<<10*tensorCount(l)
	whole := meta.MaxWholeBytes()
	bound := 2*whole + devices*verifyBlockBytes + tensor + writeBuf + overhead
	if weights < int64(5*bound) {
		t.Fatalf("weights %d bytes are not much larger than the bound %d", weights, bound)
	}
	dir := t.TempDir()
	got, want := filepath.Join(dir, "got"), filepath.Join(dir, "want")
	opts := hf.ExportOptions{Names: hf.NamesHF}

	before := heapAllocated()
	if _, err := ExportCheckpoint(context.Background(), got, src, opts); err != nil {
		t.Fatal(err)
	}
	used := heapAllocated() - before
	t.Logf("ExportCheckpoint of %d bytes of weights: %d bytes allocated (bound %d: 2 × %d + %d × %d + %d + %d + %d)",
		weights, used, bound, whole, devices, verifyBlockBytes, tensor, writeBuf, overhead)
	if used > uint64(bound) {
		t.Errorf("ExportCheckpoint allocated %d bytes, over the bound %d", used, bound)
	}
	exportStateLegacy(t, want, src, opts)
	sameFile(t, "ExportCheckpoint", got, want)
}

// tensorCount is the number of tensors of l.
func tensorCount(l *model.Layout) int {
	n := 0
	for _, ch := range l.Chunks {
		n += len(ch.Tensors)
	}
	return n
}
