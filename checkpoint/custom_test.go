package checkpoint

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

func customLayout(t *testing.T, hid int) *model.Layout {
	t.Helper()
	l, err := model.CustomLayout("mlp", []model.Chunk{
		{Name: "in", Tensors: []model.Tensor{{Name: "w1", Shape: []int{hid, 3}}, {Name: "b1", Shape: []int{hid}}}},
		{Name: "out", Tensors: []model.Tensor{{Name: "w2", Shape: []int{2, hid}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestCustomModelState: a custom model's checkpoint records its name and
// tensors (no shape), loads back with them, rebuilds its layout, reshards,
// and is refused by another version of the model or a decoder; a State
// that mixes the two descriptions is invalid.
func TestCustomModelState(t *testing.T) {
	l := customLayout(t, 4)
	st, err := NewState(l, 2, 0, 1, MixedPrecisionStates)
	if err != nil {
		t.Fatal(err)
	}
	for r := range st.Devices {
		for c := range st.Chunks {
			for k := range st.States {
				for i := range st.Data[r][c][k] {
					st.Data[r][c][k][i] = byte(r + 3*c + 7*k + i)
				}
			}
		}
	}
	if st.Model != "mlp" || st.Shape != (model.Shape{}) || len(st.Chunks[0].Tensors) != 2 {
		t.Fatalf("state model %q shape %v chunk 0 %+v", st.Model, st.Shape, st.Chunks[0])
	}
	dir := t.TempDir()
	if err := SaveWith(dir, st, Options{}); err != nil {
		t.Fatal(err)
	}
	got, err := LoadFor(dir, ExpectLayout(l, 3, 1, MixedPrecisionStates))
	if err != nil {
		t.Fatal(err)
	}
	back, err := got.Layout()
	if err != nil {
		t.Fatal(err)
	}
	if back.Name != "mlp" || back.ParamCount() != l.ParamCount() || back.Chunks[1].Tensors[0].Name != "w2" || got.Devices != 3 {
		t.Errorf("loaded layout %+v on %d devices", back, got.Devices)
	}
	k := st.StateIndex(shard.Master)
	for c := range st.Chunks {
		if string(got.Gather(c, k)) != string(st.Gather(c, k)) {
			t.Errorf("chunk %d master changed through save, load and reshard", c)
		}
	}

	if _, err := LoadFor(dir, ExpectLayout(customLayout(t, 5), 2, 1, MixedPrecisionStates)); err == nil || !strings.Contains(err.Error(), `chunk 0 saved as "in" (16 elements: w1 [4 3] b1 [4])`) {
		t.Errorf("another version of the model: %v", err)
	}
	tiny, _ := model.Lookup("tiny")
	if _, err := LoadFor(dir, Expect{Shape: tiny, Devices: 2, ShardAlignElems: 1, States: MixedPrecisionStates}); err == nil || !strings.Contains(err.Error(), `saved for the custom model "mlp", this run trains shape`) {
		t.Errorf("into a decoder: %v", err)
	}

	mixed := st.Meta()
	mixed.Shape = tiny
	if err := mixed.validateMeta(); err == nil || !strings.Contains(err.Error(), "both a shape") {
		t.Errorf("shape and model: %v", err)
	}
	noTensors := st.Meta()
	noTensors.Chunks = append([]ChunkInfo(nil), st.Chunks...)
	noTensors.Chunks[1].Tensors = nil
	if err := noTensors.validateMeta(); err == nil || !strings.Contains(err.Error(), `chunk 1 ("out") has no tensors`) {
		t.Errorf("a chunk without its tensors: %v", err)
	}
	decoder, err := NewState(mustLayout(t, tiny), 1, 0, 1, MixedPrecisionStates)
	if err != nil {
		t.Fatal(err)
	}
	decoder.Chunks[0].Tensors = []ChunkTensor{{Name: "wte", Shape: []int{256, 32}}}
	if err := decoder.validateMeta(); err == nil || !strings.Contains(err.Error(), "only a custom model's checkpoint does") {
		t.Errorf("tensors in a decoder's checkpoint: %v", err)
	}
}

func mustLayout(t *testing.T, s model.Shape) *model.Layout {
	t.Helper()
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
