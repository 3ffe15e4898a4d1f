package checkpoint

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
)

// The checks of a run that starts from a model (`strata train --init
// BASE`) with a PEFT adapter (`--adapter DIR`) beyond the adapter's own
// (hf.OpenPEFT): that the adapter was made for BASE, and that BASE does
// not already hold it.

// AdapterInit is the model a run with a PEFT adapter starts from, as
// CheckAdapter compares the adapter with it.
type AdapterInit struct {
	Path string // as the caller named it (--init)
	// Dir is the directory Path names (absolute): a Hugging Face model's,
	// or the Strata checkpoint it resolved to.
	Dir string
	// Checkpoint is the Strata checkpoint directory, "" for a Hugging
	// Face directory.
	Checkpoint string
	// Names are what a Hugging Face directory says it is: its
	// config.json's _name_or_path and, in a hub cache
	// (.../models--ORG--NAME/snapshots/X), ORG/NAME.
	Names []string
	Shape model.Shape
	// Weights reads its weights (a checkpoint's with its adapters merged
	// in: Reader.ReadChunk); nil when not open.
	Weights interface {
		ReadChunk(c int, dst []float32) error
	}
}

// CheckAdapter checks the PEFT adapter a against the model init it is
// applied to. It refuses an adapter init already holds: init a LoRA run's
// checkpoint reads its weights with its adapters merged in, so the adapter
// it exported would be applied twice (compared within bf16 rounding: an
// export in bf16 is still the same). It compares the base model a names
// (adapter_config.json's base_model_name_or_path) with init: a base that
// is a directory here is compared with init as a directory (a Hugging Face
// model, or a Strata checkpoint resolved as Find resolves it, or a run's
// checkpoints/): another one is an error, or with allowOther a note. A
// name that is no directory here (a hub id, a path gone) is compared with
// what init says of itself (Names); it cannot be resolved, so a
// difference is a note.
func CheckAdapter(a *hf.PEFTAdapter, init AdapterInit, allowOther bool) (note string, err error) {
	if err := ownAdapter(a, init); err != nil {
		return "", err
	}
	return adapterBase(a, init, allowOther)
}

func adapterBase(a *hf.PEFTAdapter, im AdapterInit, allowOther bool) (note string, err error) {
	base := a.BaseModel
	initDir := im.Dir
	if base == "" {
		return fmt.Sprintf("--adapter %s names no base model (adapter_config.json's base_model_name_or_path is empty): it is applied to --init %s unchecked", a.Dir, im.Path), nil
	}
	if _, serr := os.Stat(base); serr != nil {
		if slices.Contains(im.Names, base) {
			return "", nil
		}
		said := "which names itself nothing comparable"
		if len(im.Names) > 0 {
			said = "which names itself " + strings.Join(im.Names, ", ")
		}
		return fmt.Sprintf("--adapter %s was made for %s (adapter_config.json's base_model_name_or_path), which is no directory here: it cannot be checked against --init %s, %s", a.Dir, base, im.Path, said), nil
	}
	baseDir, _ := filepath.Abs(base)
	if d, ok := modelDir(base); ok {
		baseDir = d
	}
	if samePath(baseDir, initDir) {
		return "", nil
	}
	what := "another model"
	if im.Checkpoint != "" {
		if m, _, err := ReadManifest(im.Checkpoint); err == nil && m.LoRA != nil && m.Source != nil && samePath(baseDir, m.Source.BaseModel()) {
			what = fmt.Sprintf("the base of the LoRA run %s, whose weights --init reads with its adapters merged in (an adapter of that base would be applied on top of them)", im.Path)
		}
	}
	msg := fmt.Sprintf("--adapter %s was made for %s (adapter_config.json's base_model_name_or_path), not for --init %s (%s): %s", a.Dir, base, im.Path, initDir, what)
	if allowOther {
		return msg + "; applied anyway (--allow-other-base)", nil
	}
	return "", fmt.Errorf("train: %s; an adapter trains against the weights it was made for: name its base with --init, or pass --allow-other-base if --init is that model (a copy, a conversion)", msg)
}

// modelDir is the directory of the model at path as a run's --init
// resolves it (absolute): a Hugging Face directory itself, else the
// checkpoint a checkpoint directory, its manifest.json, a directory of
// checkpoints or a run's --out (its checkpoints/) names; false when path
// is neither.
func modelDir(path string) (string, bool) {
	dir := path
	if ok, _ := hf.ProbeDir(path); !ok {
		if fi, err := os.Stat(path); err == nil && !fi.IsDir() && filepath.Base(path) == ManifestName {
			dir = filepath.Dir(path)
		} else if d, _, err := Find(path); err == nil {
			dir = d
		} else if d, _, err := Find(filepath.Join(path, "checkpoints")); err == nil {
			dir = d
		} else {
			return "", false
		}
		m, d, err := ReadManifest(dir)
		if err != nil || m.Model != "" {
			return "", false
		}
		dir = d
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir, true
	}
	return abs, true
}

// ownAdapter refuses an adapter that im already holds (see CheckAdapter).
func ownAdapter(a *hf.PEFTAdapter, im AdapterInit) error {
	if im.Checkpoint == "" || im.Weights == nil {
		return nil
	}
	m, _, err := ReadManifest(im.Checkpoint)
	if err != nil || m.LoRA == nil {
		return nil
	}
	o, p := *m.LoRA, a.LoRA
	if o.R != p.R || o.Alpha != p.Alpha || o.RSLoRA != p.RSLoRA || !slices.Equal(o.Targets, p.Targets) {
		return nil
	}
	base, err := model.NewLayout(im.Shape)
	if err != nil {
		return nil
	}
	l, err := base.WithLoRA(p)
	if err != nil {
		return nil
	}
	for layer := range im.Shape.Layers {
		c := l.AdapterChunk(layer)
		x, y := make([]float32, l.Chunks[c].Len), make([]float32, l.Chunks[c].Len)
		if a.ReadChunk(c, x) != nil || im.Weights.ReadChunk(c, y) != nil {
			return nil
		}
		for i := range x {
			if d := math.Abs(float64(x[i]) - float64(y[i])); d > 1.0/128*math.Abs(float64(y[i])) {
				return nil
			}
		}
	}
	origin := m.Source.BaseModel()
	if origin == "" {
		origin = "BASE"
	}
	return fmt.Errorf("train: --adapter %s holds the adapters of --init %s itself (a LoRA run, whose weights --init reads with those adapters merged in): they would be applied twice; continue that run with --resume %s, or start from its base with --init %s --adapter %s",
		a.Dir, im.Path, im.Path, origin, a.Dir)
}

// samePath says whether a and b name the same directory (the same
// cleaned path when either is gone).
func samePath(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return os.SameFile(fa, fb)
}
