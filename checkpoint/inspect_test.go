package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInspect: a directory of checkpoints is inspected at its latest with
// every rank file verified (a corrupted one fails, named, with the whole
// inspection returned), --no-verify reads none, and a rank file read as a
// safetensors file lists its tensors.
func TestInspect(t *testing.T) {
	dir := t.TempDir()
	if err := Save(dir, filledState(t, 2, 2048, 1)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in, err := Inspect(ctx, dir, InspectOptions{})
	if err != nil || in.Checkpoint == nil || in.File != nil {
		t.Fatalf("inspect %s: %v %+v", dir, err, in)
	}
	ck := in.Checkpoint
	if ck.Latest != "step-00000100" || ck.Manifest.Step != 100 || len(ck.Files) != 2 || ck.Files[1].Verified == nil || !*ck.Files[1].Verified {
		t.Errorf("inspection %+v", ck)
	}
	var text, js bytes.Buffer
	if err := in.WriteText(&text); err != nil || !strings.Contains(text.String(), "checkpoint "+filepath.Join(dir, "step-00000100")+"\n") ||
		!strings.Contains(text.String(), "rank-00001.safetensors") {
		t.Errorf("text %v:\n%s", err, text.String())
	}
	var back CheckpointInspection
	if err := in.WriteJSON(&js); err != nil || json.Unmarshal(js.Bytes(), &back) != nil || back.Dir != ck.Dir || back.Params != ck.Params {
		t.Errorf("json %v:\n%s", err, js.String())
	}
	if b, err := json.Marshal(in); err != nil || !bytes.Equal(bytes.TrimSpace(b), bytes.TrimSpace(compact(t, js.Bytes()))) {
		t.Errorf("MarshalJSON %v: %s", err, b)
	}

	path := filepath.Join(dir, "step-00000100", "rank-00001.safetensors")
	in, err = Inspect(ctx, path, InspectOptions{})
	if err != nil || in.File == nil || len(in.File.Tensors) == 0 || in.File.Params == 0 {
		t.Fatalf("inspect %s: %v %+v", path, err, in)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	in, err = Inspect(ctx, dir, InspectOptions{})
	if err == nil || !strings.Contains(err.Error(), "1 of 2 rank files failed verification") || in == nil || in.Checkpoint == nil ||
		*in.Checkpoint.Files[1].Verified || in.Checkpoint.Files[1].Error == "" {
		t.Errorf("inspect of a corrupted file: %v %+v", err, in)
	}
	in, err = Inspect(ctx, dir, InspectOptions{NoVerify: true})
	if err != nil || in.Checkpoint.Files[1].Verified != nil {
		t.Errorf("inspect without verifying: %v %+v", err, in)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Inspect(cancelled, dir, InspectOptions{}); err == nil {
		t.Error("inspect with a cancelled context: no error")
	}
}

func compact(t *testing.T, b []byte) []byte {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
