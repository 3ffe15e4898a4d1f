package cmd

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
)

// The checks of `strata train --init BASE --adapter DIR` beyond the
// adapter's own (hf.OpenPEFT): that the adapter was made for BASE, and
// that BASE does not already hold it.

// adapterBase compares the base model adapter a names (adapter_config.json's
// base_model_name_or_path) with the run's --init im. A base that is a
// directory here is compared with --init as a directory (a Hugging Face
// model, or a Strata checkpoint resolved as --init resolves it): another
// one is an error, or with allowOther a note. A name that is no directory
// here (a hub id, a path gone) is compared with what --init says of
// itself (config.json's _name_or_path, a hub cache directory's
// models--ORG--NAME); it cannot be resolved, so a difference is a note.
func adapterBase(a *hf.PEFTAdapter, im *initModel, allowOther bool) (note string, err error) {
	base := a.BaseModel
	initDir := im.identity()
	if base == "" {
		return fmt.Sprintf("--adapter %s names no base model (adapter_config.json's base_model_name_or_path is empty): it is applied to --init %s unchecked", a.Dir, im.path), nil
	}
	if _, serr := os.Stat(base); serr != nil {
		names := im.names()
		if slices.Contains(names, base) {
			return "", nil
		}
		said := "which names itself nothing comparable"
		if len(names) > 0 {
			said = "which names itself " + strings.Join(names, ", ")
		}
		return fmt.Sprintf("--adapter %s was made for %s (adapter_config.json's base_model_name_or_path), which is no directory here: it cannot be checked against --init %s, %s", a.Dir, base, im.path, said), nil
	}
	other, perr := probeModel(base, "adapter base")
	baseDir, _ := filepath.Abs(base)
	if perr == nil {
		baseDir = other.identity()
	}
	if samePath(baseDir, initDir) {
		return "", nil
	}
	what := "another model"
	if im.ckpt != "" {
		if m, _, err := checkpoint.ReadManifest(im.ckpt); err == nil && m.LoRA != nil && m.Source != nil && samePath(baseDir, m.Source.BaseModel()) {
			what = fmt.Sprintf("the base of the LoRA run %s, whose weights --init reads with its adapters merged in (an adapter of that base would be applied on top of them)", im.path)
		}
	}
	msg := fmt.Sprintf("--adapter %s was made for %s (adapter_config.json's base_model_name_or_path), not for --init %s (%s): %s", a.Dir, base, im.path, initDir, what)
	if allowOther {
		return msg + "; applied anyway (--allow-other-base)", nil
	}
	return "", fmt.Errorf("train: %s; an adapter trains against the weights it was made for: name its base with --init, or pass --allow-other-base if --init is that model (a copy, a conversion)", msg)
}

// ownAdapter refuses an adapter that --init already holds: --init a LoRA
// run's checkpoint reads its weights with its adapters merged in, so the
// adapter it exported would be applied twice. Its adapters are compared
// with a's (within bf16 rounding: an export in bf16 is still the same).
func ownAdapter(a *hf.PEFTAdapter, im *initModel) error {
	if im.ckpt == "" || im.src == nil {
		return nil
	}
	m, _, err := checkpoint.ReadManifest(im.ckpt)
	if err != nil || m.LoRA == nil {
		return nil
	}
	o, p := *m.LoRA, a.LoRA
	if o.R != p.R || o.Alpha != p.Alpha || o.RSLoRA != p.RSLoRA || !slices.Equal(o.Targets, p.Targets) {
		return nil
	}
	base, err := model.NewLayout(im.shape)
	if err != nil {
		return nil
	}
	l, err := base.WithLoRA(p)
	if err != nil {
		return nil
	}
	for layer := range im.shape.Layers {
		c := l.AdapterChunk(layer)
		x, y := make([]float32, l.Chunks[c].Len), make([]float32, l.Chunks[c].Len)
		if a.ReadChunk(c, x) != nil || im.src.ReadChunk(c, y) != nil {
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
		a.Dir, im.path, im.path, origin, a.Dir)
}

// identity is the directory --init names: a Hugging Face model's, or the
// Strata checkpoint it resolved to (absolute).
func (im *initModel) identity() string {
	d := im.ckpt
	if im.hf != nil {
		d = im.path
	}
	abs, err := filepath.Abs(d)
	if err != nil {
		return d
	}
	return abs
}

// names are what a Hugging Face --init says it is: its config.json's
// _name_or_path and, in a hub cache (.../models--ORG--NAME/snapshots/X),
// ORG/NAME.
func (im *initModel) names() []string {
	if im.hf == nil {
		return nil
	}
	var out []string
	if b, err := os.ReadFile(filepath.Join(im.path, hf.ConfigName)); err == nil {
		var c struct {
			Name string `json:"_name_or_path"`
		}
		if json.Unmarshal(b, &c) == nil && c.Name != "" {
			out = append(out, c.Name)
		}
	}
	for _, part := range strings.Split(filepath.ToSlash(im.identity()), "/") {
		if rest, ok := strings.CutPrefix(part, "models--"); ok {
			out = append(out, strings.Replace(rest, "--", "/", 1))
		}
	}
	return out
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
