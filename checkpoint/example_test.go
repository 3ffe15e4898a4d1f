package checkpoint_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/model"
)

// ExampleExport saves a tiny model's weights as a checkpoint of one
// device, then exports it as a Hugging Face model directory.
func ExampleExport() {
	dir, err := os.MkdirTemp("", "strata-export-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	shape, err := model.Lookup("tiny")
	if err != nil {
		panic(err)
	}
	l, err := model.NewLayout(shape)
	if err != nil {
		panic(err)
	}
	st, err := checkpoint.NewState(l, 1, 3, 1, checkpoint.AdamStates(dtype.F32, dtype.F32))
	if err != nil {
		panic(err)
	}
	st.Step = 10
	for c := range st.Chunks {
		copy(st.Shard(0, c, 0), dtype.Bytes(l.InitChunk(1, c))) // the params; Adam's moments stay zero
	}
	ckpt := filepath.Join(dir, "checkpoints")
	if err := checkpoint.Save(ckpt, st); err != nil {
		panic(err)
	}

	out := filepath.Join(dir, "hf")
	res, err := checkpoint.Export(context.Background(), ckpt, out, checkpoint.ExportOptions{Format: checkpoint.FormatHF})
	if err != nil {
		panic(err)
	}
	fmt.Println("step", res.Step, "in", res.DType, "files", res.Files, "and", res.Written)
	// Output:
	// step 10 in f32 files [model.safetensors] and [generation_config.json]
}

// ExampleInspect saves a tiny model's checkpoint of one device, then
// inspects the directory of checkpoints: its latest, with every rank file
// verified.
func ExampleInspect() {
	dir, err := os.MkdirTemp("", "strata-inspect-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	shape, err := model.Lookup("tiny")
	if err != nil {
		panic(err)
	}
	l, err := model.NewLayout(shape)
	if err != nil {
		panic(err)
	}
	st, err := checkpoint.NewState(l, 1, 3, 1, checkpoint.AdamStates(dtype.F32, dtype.F32))
	if err != nil {
		panic(err)
	}
	st.Step = 10
	if err := checkpoint.Save(dir, st); err != nil {
		panic(err)
	}

	in, err := checkpoint.Inspect(context.Background(), dir, checkpoint.InspectOptions{})
	if err != nil {
		panic(err)
	}
	ck := in.Checkpoint
	fmt.Println("latest", ck.Latest, "step", ck.Manifest.Step, "files", len(ck.Files), "verified", *ck.Files[0].Verified)
	// Output:
	// latest step-00000010 step 10 files 1 verified true
}
