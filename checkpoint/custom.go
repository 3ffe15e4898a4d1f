package checkpoint

import (
	"fmt"
	"slices"

	"github.com/strata-ai/strata/model"
)

// A custom model is one defined outside package model (model.CustomLayout:
// a Go program's own architecture, trained through engine.Options.Model).
// No Shape describes it, so its checkpoint records what does: the model's
// name (State.Model, the manifest's "model") and every chunk's tensors,
// name and shape, in layout order (ChunkInfo.Tensors), from which Layout
// rebuilds its layout. A run restores such a checkpoint only when its own
// model has that name and the same chunks and tensors (Match), and
// ExportCheckpoint writes its weights under the model's own tensor names.
// What needs an architecture is refused: Hugging Face names and
// directories (config.json has no way to say what a custom model
// computes), and restoring it into a decoder of package model or the
// reverse.

// ChunkTensor is one tensor of a custom model's chunk: its name and shape
// (its offset follows from the ones before it: a chunk's tensors are
// packed densely in order).
type ChunkTensor struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

// LayoutChunks is l's chunk table sharded over devices ranks with shard
// alignment alignElems; a custom layout's chunks list their tensors.
func LayoutChunks(l *model.Layout, devices, alignElems int) []ChunkInfo {
	out := make([]ChunkInfo, len(l.Chunks))
	for c, ch := range l.Chunks {
		out[c] = ChunkInfo{Name: ch.Name, Elems: ch.Len, ShardElems: ShardElems(ch.Len, devices, alignElems)}
		if l.Custom() {
			for _, t := range ch.Tensors {
				out[c].Tensors = append(out[c].Tensors, ChunkTensor{Name: t.Name, Shape: append([]int(nil), t.Shape...)})
			}
		}
	}
	return out
}

// ExpectLayout is what a run of layout l on devices ranks with shard
// alignment alignElems and states needs of a checkpoint: l's shape, or a
// custom layout's name and chunk table.
func ExpectLayout(l *model.Layout, devices, alignElems int, states []StateSpec) Expect {
	e := Expect{Shape: l.Shape, LoRA: l.LoRA, Devices: devices, ShardAlignElems: alignElems, States: states}
	if l.Custom() {
		e.Model, e.Chunks = l.Name, LayoutChunks(l, devices, alignElems)
	}
	return e
}

// Layout is the layout the checkpoint describes: model.NewLayout of its
// shape, or a custom model's, rebuilt from its name and chunk table.
func (st *State) Layout() (*model.Layout, error) {
	if st.Model == "" {
		for c, ch := range st.Chunks {
			if len(ch.Tensors) > 0 {
				return nil, fmt.Errorf("checkpoint: chunk %d (%s) lists tensors, which only a custom model's checkpoint does (it has no model name)", c, ch.Name)
			}
		}
		l, err := model.NewLayout(st.Shape)
		if err == nil && st.LoRA != nil {
			l, err = l.WithLoRA(*st.LoRA)
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		return l, nil
	}
	if st.Shape != (model.Shape{}) {
		return nil, fmt.Errorf("checkpoint: both a shape (%s) and a custom model (%q)", st.Shape, st.Model)
	}
	chunks := make([]model.Chunk, len(st.Chunks))
	for c, ch := range st.Chunks {
		chunks[c].Name = ch.Name
		for _, t := range ch.Tensors {
			chunks[c].Tensors = append(chunks[c].Tensors, model.Tensor{Name: t.Name, Shape: t.Shape})
		}
	}
	l, err := model.CustomLayout(st.Model, chunks)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return l, nil
}

// matchModel says why st is not a checkpoint of the custom model e
// names, or of a decoder when e names none (nil when it is, or when
// neither is custom: Match compares the shapes).
func (st *State) matchModel(e Expect) error {
	if st.Model == "" && e.Model == "" {
		return nil
	}
	if st.Model != e.Model {
		return fmt.Errorf("checkpoint: saved for %s, this run trains %s; a checkpoint restores only the model that saved it", describeModel(st.Shape, st.Model), describeModel(e.Shape, e.Model))
	}
	if len(st.Chunks) != len(e.Chunks) {
		return fmt.Errorf("checkpoint: model %q: saved with %d chunks, this run's layout has %d (another version of the model?)", st.Model, len(st.Chunks), len(e.Chunks))
	}
	for c, a := range st.Chunks {
		b := e.Chunks[c]
		same := a.Elems == b.Elems && len(a.Tensors) == len(b.Tensors)
		for i := 0; same && i < len(a.Tensors); i++ {
			same = a.Tensors[i].Name == b.Tensors[i].Name && slices.Equal(a.Tensors[i].Shape, b.Tensors[i].Shape)
		}
		if !same {
			return fmt.Errorf("checkpoint: model %q: chunk %d saved as %s, this run's is %s (another version of the model?)", st.Model, c, describeChunk(a), describeChunk(b))
		}
	}
	return nil
}

func describeModel(s model.Shape, name string) string {
	if name != "" {
		return fmt.Sprintf("the custom model %q", name)
	}
	return fmt.Sprintf("shape %s", s)
}

func describeChunk(ch ChunkInfo) string {
	s := fmt.Sprintf("%q (%d elements:", ch.Name, ch.Elems)
	for _, t := range ch.Tensors {
		s += fmt.Sprintf(" %s %v", t.Name, t.Shape)
	}
	return s + ")"
}

// ParamCount is the number of parameters of the checkpoint's chunks.
func (st *State) ParamCount() int64 {
	var n int64
	for _, c := range st.Chunks {
		n += int64(c.Elems)
	}
	return n
}
