package cmd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
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

// TestAdapterChecks: `strata train --init BASE --adapter DIR` on a tiny
// Llama. The adapter's adapter_config.json names its base
// (base_model_name_or_path, as export --format peft writes it):
//   - another base of the same shapes (another seed) is refused naming
//     both and --allow-other-base, which then applies it with a note;
//   - --init of the LoRA run the adapter was exported from (whose weights
//     come with the adapters merged in) is refused: applied twice;
//   - a base that is no directory here is a note: matched by the base's
//     config.json _name_or_path it says nothing; another name, or none,
//     is noted;
//   - an adapter with a NaN is refused naming its file and tensor;
//   - the run names its adapter ("initial adapter: DIR") and records it in
//     run.json and its checkpoints' source.
//
// Before, every one of these was accepted without a word.
func TestAdapterChecks(t *testing.T) {
	dir := t.TempDir()
	s := model.Shape{Arch: model.ArchLlama, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 256, MaxSeq: 64, RopeTheta: 10000}
	base, other := filepath.Join(dir, "base"), filepath.Join(dir, "other")
	writeHFEvalModel(t, base, s, 7, dtype.F32, testTokenizer{})
	writeHFEvalModel(t, other, s, 8, dtype.F32, testTokenizer{})
	text := filepath.Join(dir, "train.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("The cat sat on the mat. The dog ate the bread. ", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	lora := writeFile(t, "lora.json", strings.Replace(loraConfig, "%s", "0.01", 1))
	plain := writeFile(t, "plain.json", strings.Replace(strings.Replace(loraConfig, "%s", "0.01", 1), `, "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}`, "", 1))
	train := func(out string, args ...string) (string, error) {
		t.Helper()
		stdout, stderr, err := runApp(t, append([]string{"train", "--data", text, "--steps", "1", "--save-every", "1", "--no-progress", "--out", out}, args...)...)
		if err != nil {
			return stdout + stderr + err.Error(), err
		}
		return stdout + stderr, nil
	}
	run := filepath.Join(dir, "run")
	if out, err := train(run, "--init", base, "--config", lora); err != nil {
		t.Fatal(out)
	}
	adapter := filepath.Join(dir, "adapter")
	if _, errOut, err := runApp(t, "export", "--format", "peft", run, adapter); err != nil {
		t.Fatalf("export: %v\n%s", err, errOut)
	}
	absBase, _ := filepath.Abs(base)
	absAdapter, _ := filepath.Abs(adapter)

	// The right base: no note about it; the adapter is named and recorded.
	good := filepath.Join(dir, "good")
	out, err := train(good, "--init", base, "--adapter", adapter, "--config", plain)
	if err != nil {
		t.Fatal(out)
	}
	if !strings.Contains(out, "\ninitial adapter: "+adapter+" (r 8, alpha 16") || strings.Contains(out, "base_model_name_or_path),") {
		t.Errorf("the run does not name its adapter, or notes its base:\n%s", out)
	}
	var rf struct {
		Source *hf.Source `json:"source"`
	}
	if b, err := os.ReadFile(filepath.Join(good, "run.json")); err != nil || json.Unmarshal(b, &rf) != nil || rf.Source == nil || rf.Source.Adapter != absAdapter || rf.Source.Path != absBase {
		t.Errorf("run.json's source: %+v, want the base %s and the adapter %s (%v)", rf.Source, absBase, absAdapter, err)
	}
	if m, _, err := checkpoint.ReadManifest(filepath.Join(good, "checkpoints")); err != nil || m.Source == nil || m.Source.Adapter != absAdapter {
		t.Errorf("the checkpoint's source does not record the adapter: %v", err)
		if m != nil {
			t.Logf("source: %+v", m.Source)
		}
	}

	// Another base of the same shapes.
	out, err = train(filepath.Join(dir, "o1"), "--init", other, "--adapter", adapter, "--config", plain)
	if err == nil || !strings.Contains(out, "was made for "+absBase) || !strings.Contains(out, "not for --init "+other) || !strings.Contains(out, "--allow-other-base") {
		t.Errorf("an adapter of another base: %v\n%s", err, out)
	}
	out, err = train(filepath.Join(dir, "o2"), "--init", other, "--adapter", adapter, "--config", plain, "--allow-other-base")
	if err != nil || !strings.Contains(out, "note: --adapter "+adapter+" was made for "+absBase) || !strings.Contains(out, "applied anyway (--allow-other-base)") {
		t.Errorf("--allow-other-base: %v\n%s", err, out)
	}

	// The LoRA run itself: its adapters twice.
	out, err = train(filepath.Join(dir, "twice"), "--init", run, "--adapter", adapter, "--config", plain)
	if err == nil || !strings.Contains(out, "holds the adapters of --init "+run+" itself") || !strings.Contains(out, "applied twice") {
		t.Errorf("--init LORA_RUN --adapter ITS_ADAPTER: %v\n%s", err, out)
	}

	// Names that are no directory here.
	named := func(name string) string {
		t.Helper()
		d := filepath.Join(t.TempDir(), "adapter")
		if err := os.CopyFS(d, os.DirFS(adapter)); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(d, hf.PEFTConfigFile)
		b, _ := os.ReadFile(p)
		b = []byte(strings.Replace(string(b), fmt.Sprintf("%q", absBase), fmt.Sprintf("%q", name), 1))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	cfgPath := filepath.Join(base, hf.ConfigName)
	cb, _ := os.ReadFile(cfgPath)
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(string(cb), "{", `{"_name_or_path": "org/tiny-llama", `, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, note string }{
		{"org/tiny-llama", ""},
		{"org/another-model", "was made for org/another-model (adapter_config.json's base_model_name_or_path), which is no directory here: it cannot be checked against --init " + base + ", which names itself org/tiny-llama"},
		{"", "names no base model"},
	} {
		a := named(c.name)
		out, err := train(filepath.Join(t.TempDir(), "run"), "--init", base, "--adapter", a, "--config", plain)
		if err != nil {
			t.Errorf("%q: %s", c.name, out)
			continue
		}
		if c.note == "" && strings.Contains(out, "note: --adapter") || c.note != "" && !strings.Contains(out, "note: --adapter "+a+" "+c.note) && !strings.Contains(out, c.note) {
			t.Errorf("base %q: want the note %q:\n%s", c.name, c.note, out)
		}
	}

	// A NaN in the adapter.
	nan := filepath.Join(dir, "nan")
	if err := os.CopyFS(nan, os.DirFS(adapter)); err != nil {
		t.Fatal(err)
	}
	wf := filepath.Join(nan, hf.PEFTWeightsFile)
	f, err := safetensors.Open(wf)
	if err != nil {
		t.Fatal(err)
	}
	const victim = "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"
	ti, ok := f.Header.Tensor(victim)
	if !ok || ti.DType != "F32" {
		t.Fatalf("%s: %+v", victim, ti)
	}
	at := f.Header.DataStart() + ti.Begin + 3*4 // element 3
	f.Close()
	w, err := os.OpenFile(wf, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte{0, 0, 0xc0, 0x7f}, at); err != nil { // a NaN
		t.Fatal(err)
	}
	w.Close()
	out, err = train(filepath.Join(dir, "n"), "--init", base, "--adapter", nan, "--config", plain)
	if err == nil || !strings.Contains(out, nan) || !strings.Contains(out, hf.PEFTWeightsFile+": "+victim+" holds NaN at element 3") {
		t.Errorf("an adapter with a NaN: %v\n%s", err, out)
	}
}
