package run

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/source"
)

// OpenAdapter opens the PEFT adapter in dir (--adapter) for the run's
// base shape and sets cfg's strata.lora from it; a strata.lora of the
// config that says otherwise is refused, as are an adapter that init (the
// run's --init, opened) already holds and one made for another base (a
// note with allowOther, --allow-other-base, or when its base cannot be
// resolved). It returns the adapter, the run's source with the adapter
// recorded (hf.Source.Adapter) and the note ("" for none; also with the
// error of a strata.lora that says otherwise).
func OpenAdapter(ctx context.Context, dir string, cfg *config.Config, init *source.Model, allowOther bool) (*hf.PEFTAdapter, *hf.Source, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, "", err
	}
	if cfg.Shape() == nil {
		return nil, nil, "", fmt.Errorf("train: --adapter %s: the run's model has no shape", dir)
	}
	a, err := hf.OpenPEFT(dir, model.Shape(*cfg.Shape()))
	if err != nil {
		return nil, nil, "", fmt.Errorf("train: --adapter: %w", err)
	}
	// Refused first: an adapter that --init already holds.
	_, err = checkpoint.CheckAdapter(a, adapterInit(init, true), true)
	note := ""
	if err == nil {
		// The base model the adapter names against --init.
		note, err = checkpoint.CheckAdapter(a, adapterInit(init, false), allowOther)
	}
	if err != nil {
		a.Close()
		return nil, nil, "", err
	}
	o := &config.LoRA{R: a.LoRA.R, Alpha: a.LoRA.Alpha, Dropout: a.LoRA.Dropout, TargetModules: a.LoRA.Targets, UseRSLoRA: a.LoRA.RSLoRA}
	if have := cfg.Strata.LoRA; have != nil {
		got, _ := json.Marshal(have)
		want, _ := json.Marshal(o)
		if string(got) != string(want) {
			a.Close()
			return nil, nil, note, fmt.Errorf("train: --adapter %s is r %d, alpha %g, target_modules %v, use_rslora %t; the config's strata.lora %s says otherwise: leave strata.lora out (it comes from the adapter) or make it the same",
				dir, o.R, o.Alpha, o.TargetModules, o.UseRSLoRA, got)
		}
	}
	cfg.Strata.LoRA = o
	src := *init.Source
	src.Adapter, _ = filepath.Abs(dir)
	return a, &src, note, nil
}

// adapterInit is im as checkpoint.CheckAdapter takes it: with its
// weights for the check that it holds the adapter itself (own), else with
// none.
func adapterInit(im *source.Model, own bool) checkpoint.AdapterInit {
	ai := checkpoint.AdapterInit{Path: im.Path, Dir: initIdentity(im), Checkpoint: im.Checkpoint, Names: initNames(im), Shape: im.Shape}
	if w := im.Weights(); own && w != nil {
		ai.Weights = w
	}
	return ai
}

// initIdentity is the directory --init names: a Hugging Face model's, or
// the Strata checkpoint it resolved to (absolute).
func initIdentity(im *source.Model) string {
	d := im.Checkpoint
	if im.HF != nil {
		d = im.Path
	}
	abs, err := filepath.Abs(d)
	if err != nil {
		return d
	}
	return abs
}

// initNames are what a Hugging Face --init says it is: its config.json's
// _name_or_path and, in a hub cache (.../models--ORG--NAME/snapshots/X),
// ORG/NAME.
func initNames(im *source.Model) []string {
	if im.HF == nil {
		return nil
	}
	var out []string
	if b, err := os.ReadFile(filepath.Join(im.Path, hf.ConfigName)); err == nil {
		var c struct {
			Name string `json:"_name_or_path"`
		}
		if json.Unmarshal(b, &c) == nil && c.Name != "" {
			out = append(out, c.Name)
		}
	}
	for _, part := range strings.Split(filepath.ToSlash(initIdentity(im)), "/") {
		if rest, ok := strings.CutPrefix(part, "models--"); ok {
			out = append(out, strings.Replace(rest, "--", "/", 1))
		}
	}
	return out
}
