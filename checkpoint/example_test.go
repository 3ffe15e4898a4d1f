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
	ckpt := filepath.Join(dir, "checkpoints")
	if err := saveTiny(ckpt); err != nil {
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
	if err := saveTiny(dir); err != nil {
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

// saveTiny saves step 10 of the named shape "tiny" on one device into the
// directory of checkpoints dir: its initial params, Adam's moments zero.
func saveTiny(dir string) error {
	shape, err := model.Lookup("tiny")
	if err != nil {
		return err
	}
	l, err := model.NewLayout(shape)
	if err != nil {
		return err
	}
	st, err := checkpoint.NewState(l, 1, 3, 1, checkpoint.AdamStates(dtype.F32, dtype.F32))
	if err != nil {
		return err
	}
	st.Step = 10
	for c := range st.Chunks {
		copy(st.Shard(0, c, 0), dtype.Bytes(l.InitChunk(1, c)))
	}
	return checkpoint.Save(dir, st)
}
