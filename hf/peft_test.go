package hf

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/model"
)

// peftShape is a tiny Llama of three blocks.
var peftShape = model.Shape{Arch: model.ArchLlama, Layers: 3, Dim: 16, Heads: 2, KVHeads: 1, FFN: 24, Vocab: 64, MaxSeq: 16, RopeTheta: 10000}

// writePEFT exports an adapter of peftShape with o into a new directory:
// value i of chunk c is (c+1)·0.001·(i%13−6), bad (when set) replacing
// element 5 of the last adapter chunk. It returns the directory.
func writePEFT(t *testing.T, o model.LoRA, bad float32) string {
	t.Helper()
	base, err := model.NewLayout(peftShape)
	if err != nil {
		t.Fatal(err)
	}
	l, err := base.WithLoRA(o)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	last := l.AdapterChunk(peftShape.Layers - 1)
	_, _, err = ExportPEFT(dir, l, "", dtype.F32, func(c int, dst []float32) error {
		for i := range dst {
			dst[i] = float32(c+1) * 0.001 * float32(i%13-6)
		}
		if c == last && bad != 0 {
			dst[5] = bad
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// editConfig rewrites dir's adapter_config.json through edit.
func editConfig(t *testing.T, dir string, edit func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, PEFTConfigFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPEFTConfigDefaults: an adapter_config.json without r or lora_alpha
// takes PEFT's LoraConfig defaults (8 and 8), as PEFT loads it; before,
// a missing r read as 0 ("r: 0 must be > 0").
func TestPEFTConfigDefaults(t *testing.T) {
	for _, c := range []struct {
		name  string
		o     model.LoRA
		drop  []string
		wantR int
		wantA float64
	}{
		{"no r", model.LoRA{R: 8, Alpha: 16, Targets: []string{"q_proj", "v_proj"}}, []string{"r"}, 8, 16},
		{"no lora_alpha", model.LoRA{R: 4, Alpha: 8, Targets: []string{"q_proj"}}, []string{"lora_alpha"}, 4, 8},
		{"neither", model.LoRA{R: 8, Alpha: 8, Targets: []string{"all-linear"}}, []string{"r", "lora_alpha"}, 8, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := writePEFT(t, c.o, 0)
			editConfig(t, dir, func(m map[string]any) {
				for _, k := range c.drop {
					delete(m, k)
				}
			})
			a, err := OpenPEFT(dir, peftShape)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if a.LoRA.R != c.wantR || a.LoRA.Alpha != c.wantA {
				t.Errorf("r %d, alpha %g; want %d, %g", a.LoRA.R, a.LoRA.Alpha, c.wantR, c.wantA)
			}
		})
	}
}

// TestPEFTNonFinite: a NaN or an infinity in an adapter tensor is refused
// when the adapter is opened, naming the directory, the file and the
// tensor; before, it surfaced as a non-finite loss at step 1.
func TestPEFTNonFinite(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		dir := writePEFT(t, model.LoRA{R: 2, Alpha: 4, Targets: []string{"q_proj", "o_proj"}}, bad)
		a, err := OpenPEFT(dir, peftShape)
		if err == nil {
			a.Close()
			t.Fatalf("%v: opened", bad)
		}
		for _, want := range []string{dir, PEFTWeightsFile, "base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight", "element 5"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: the error lacks %q: %v", bad, want, err)
			}
		}
	}
}

// TestPEFTExcludeModules: exclude_modules as PEFT matches it (a list: a
// module's full name or the end of it after a dot; a string: a regular
// expression of the whole name) takes modules out of target_modules; the
// adapter's tensors are then those of the remaining modules. An exclusion
// of some blocks only, of every module, or a regular expression Go cannot
// read is refused naming exclude_modules; before, exclude_modules was
// ignored (the adapter was refused for the tensors it lacks, or trained
// modules PEFT leaves alone).
func TestPEFTExcludeModules(t *testing.T) {
	kept := writePEFT(t, model.LoRA{R: 2, Alpha: 4, Targets: []string{"q_proj", "v_proj"}}, 0)
	for _, c := range []struct {
		name    string
		targets any
		exclude any
		want    []string // the targets after the exclusion
		err     string
	}{
		{"list by name", []any{"q_proj", "v_proj", "o_proj"}, []any{"o_proj"}, []string{"self_attn.q_proj", "self_attn.v_proj"}, ""},
		{"list by path end", "all-linear", []any{"self_attn.k_proj", "self_attn.o_proj", "gate_proj", "up_proj", "mlp.down_proj"}, []string{"self_attn.q_proj", "self_attn.v_proj"}, ""},
		{"regular expression", []any{"q_proj", "v_proj", "down_proj"}, `model\.layers\.\d+\.mlp\..*`, []string{"self_attn.q_proj", "self_attn.v_proj"}, ""},
		{"nothing excluded", []any{"q_proj", "v_proj"}, []any{"lm_head"}, []string{"q_proj", "v_proj"}, ""},
		{"some blocks only", []any{"q_proj", "v_proj", "o_proj"}, []any{"model.layers.0.self_attn.o_proj"}, nil, "excludes self_attn.o_proj in blocks [0] only"},
		{"every module", []any{"q_proj", "v_proj"}, `.*_proj`, nil, "excludes every module"},
		{"not RE2", []any{"q_proj", "v_proj"}, `(?!x).*`, nil, "not a regular expression Go reads"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "adapter")
			if err := os.CopyFS(dir, os.DirFS(kept)); err != nil {
				t.Fatal(err)
			}
			editConfig(t, dir, func(m map[string]any) {
				m["target_modules"], m["exclude_modules"] = c.targets, c.exclude
			})
			a, err := OpenPEFT(dir, peftShape)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "exclude_modules") {
					t.Errorf("err %v, want one naming exclude_modules and %q", err, c.err)
				}
				if err == nil {
					a.Close()
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if !slices.Equal(a.LoRA.Targets, c.want) {
				t.Errorf("targets %q, want %q", a.LoRA.Targets, c.want)
			}
		})
	}
}
