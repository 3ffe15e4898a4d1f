package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/hf"
)

// adapterBase compares the base model adapter a names with the run's
// --init im (checkpoint.CheckAdapter's comparison of the base).
func adapterBase(a *hf.PEFTAdapter, im *initModel, allowOther bool) (note string, err error) {
	return checkpoint.CheckAdapter(a, im.adapterInit(false), allowOther)
}

// ownAdapter refuses an adapter that --init already holds
// (checkpoint.CheckAdapter's first check).
func ownAdapter(a *hf.PEFTAdapter, im *initModel) error {
	_, err := checkpoint.CheckAdapter(a, im.adapterInit(true), true)
	return err
}

// adapterInit is im as checkpoint.CheckAdapter takes it: with its
// weights for the check that it holds the adapter itself (own), else with
// none.
func (im *initModel) adapterInit(own bool) checkpoint.AdapterInit {
	ai := checkpoint.AdapterInit{Path: im.path, Dir: im.identity(), Checkpoint: im.ckpt, Names: im.names(), Shape: im.shape}
	if own && im.src != nil {
		ai.Weights = im.src
	}
	return ai
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
