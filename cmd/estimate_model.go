package cmd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
)

// estimateShape reads estimate's --model: a named shape (model.Lookup), a
// Hugging Face model directory (its config.json, read as train --init reads
// it: probeModel), or a Strata run directory or checkpoint (the shape its
// checkpoint's manifest records, else the run's config.json, which train
// --out writes before the first step). A name that is none of these is a
// usage error listing the named shapes.
func estimateShape(name string) (model.Shape, error) {
	s, lookupErr := model.Lookup(name)
	if lookupErr == nil {
		return s, nil
	}
	fi, err := os.Stat(name)
	if err != nil {
		return model.Shape{}, usagef("estimate: --model %q is neither a named shape (%s) nor a Hugging Face model directory or Strata run directory or checkpoint (%v)",
			name, strings.Join(model.Names(), ", "), err)
	}
	if !hf.IsDir(name) && fi.IsDir() {
		// A run directory that holds no checkpoint (no --save-every):
		// its config.json names the shape it trains.
		if _, _, _, cerr := resolveCheckpoint(name); cerr != nil {
			if s, ok, err := runConfigShape(filepath.Join(name, hf.ConfigName)); ok || err != nil {
				return s, err
			}
		}
	}
	im, err := probeModel(name, "estimate: --model")
	if err != nil {
		return model.Shape{}, err
	}
	return im.shape, nil
}

// runConfigShape is the shape strata.model of the Strata config at path
// names (a run directory's config.json); false when there is no such file
// or it names no model.
func runConfigShape(path string) (model.Shape, bool, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return model.Shape{}, false, nil
	}
	named, err := configNamesModel(path)
	if err != nil || !named {
		return model.Shape{}, false, nil
	}
	cfg, err := config.Load(path, config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		return model.Shape{}, false, fmt.Errorf("estimate: --model: %w", err)
	}
	if cfg.Shape() == nil {
		return model.Shape{}, false, nil
	}
	return model.Shape(*cfg.Shape()), true, nil
}

// noModelError is the refusal of a --config that names no model
// (strata.model) when --model does not name one either: the config's
// default, the built-in tiny shape, is never estimated silently.
func noModelError(path string) error {
	return usagef("estimate: --config %s names no model (strata.model): give --model (a named shape: %s; a Hugging Face model directory; a Strata run directory or checkpoint), --params N, or strata.model in the config",
		path, strings.Join(model.Names(), ", "))
}
