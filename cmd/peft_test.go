package cmd

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tinyLoRAConfig is a LoRA run of the tiny model (GPT-2) from its seeded
// weights: every linear adapted at rank 2.
const tinyLoRAConfig = `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 16, "seed": 5, "lora": {"r": 2, "alpha": 4, "target_modules": "all-linear"}}
}`

// tinyLoRARun trains 2 steps of tinyLoRAConfig into dir/run with a
// checkpoint of the last step and returns the run's directory.
func tinyLoRARun(t *testing.T, dir string) string {
	t.Helper()
	run := filepath.Join(dir, "run")
	if _, errOut, err := runApp(t, trainArgs(writeFile(t, "lora.json", tinyLoRAConfig), "--steps", "2", "--save-every", "2", "--out", run)...); err != nil {
		t.Fatalf("train: %v\n%s", err, errOut)
	}
	return run
}

// TestExportPEFTFullDisk: `strata export --format peft` into a filesystem
// with room for nothing, for part of the adapter, ..., for all of it (a
// page more at each try): every export either writes the whole adapter
// directory, byte for byte the export of a roomy disk, or fails naming
// the full disk and leaves nothing behind (no directory, no temporary),
// and the same command then succeeds once the room is there. Before, a
// disk that filled after the weights left them with a 0-byte
// adapter_config.json, and the retry was refused (the directory was not
// empty).
func TestExportPEFTFullDisk(t *testing.T) {
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk")
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	mountOrSkip(t, disk, "-t", "tmpfs", "-o", "size=512k", "tmpfs")
	run := tinyLoRARun(t, dir)
	ref := filepath.Join(dir, "ref")
	if _, errOut, err := runApp(t, "export", "--format", "peft", run, ref); err != nil {
		t.Fatalf("export: %v\n%s", err, errOut)
	}
	want := snapshot(t, ref)
	need := int64(0)
	for _, b := range want {
		need += (int64(len(b)) + 4095) / 4096 * 4096
	}
	dst := filepath.Join(disk, "adapter")
	filler := filepath.Join(disk, "filler")
	failed := 0
	for room := int64(0); room <= need+4096; room += 4096 {
		fill(t, filler)
		fi, err := os.Stat(filler)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filler, max(0, fi.Size()-room)); err != nil {
			t.Fatal(err)
		}
		_, errOut, err := runApp(t, "export", "--format", "peft", run, dst)
		if err != nil {
			failed++
			if msg := errOut + err.Error(); !strings.Contains(msg, "no space left on device") {
				t.Errorf("room %d: the error does not name the full disk: %v", room, msg)
			}
			ents, _ := os.ReadDir(disk)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if !slices.Equal(names, []string{"filler"}) {
				t.Errorf("room %d: a failed export left %v beside the filler", room, names)
			}
			os.Remove(filler)
			if _, errOut, err := runApp(t, "export", "--format", "peft", run, dst); err != nil {
				t.Fatalf("room %d: the export again, with room: %v\n%s", room, err, errOut)
			}
		}
		sameFiles(t, "the adapter directory", snapshot(t, dst), want)
		os.RemoveAll(dst)
		os.Remove(filler)
	}
	if failed == 0 {
		t.Errorf("no export failed: the filesystem never filled")
	}
	t.Logf("%d of %d exports failed for room", failed, need/4096+2)
}
