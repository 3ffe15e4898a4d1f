package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
)

// initModel is the model of `strata train --init PATH`: a Hugging Face
// model directory, or a Strata checkpoint (named as --resume names one: a
// run's --out directory, its checkpoints/, a step directory). probeInit
// reads its shape before the config is resolved (the shape comes from
// PATH); open opens its weights for the engine (engine.Options.Init),
// which reads them one chunk at a time.
type initModel struct {
	path  string
	flag  string // the command and flag that named path, for errors ("train: --init")
	shape model.Shape
	hf    *hf.Config // a Hugging Face directory: its config.json
	ckpt  string     // a Strata checkpoint: its directory
	note  string     // how ckpt was found, when "latest" could not be read (checkpoint.Find)
	// source is what the run records (run.json, every checkpoint's
	// manifest): the Hugging Face directory and its tokenizer files, or
	// the Source of the checkpoint's own run.
	source *hf.Source
	src    interface {
		engine.ChunkSource
		io.Closer
	}
}

// probeInit reads the shape of the model at path: config.json of a
// Hugging Face directory, else the manifest of a Strata checkpoint.
func probeInit(path string) (*initModel, error) { return probeModel(path, "train: --init") }

// probeModel is probeInit for the command and flag flag (eval and
// generate's --model).
func probeModel(path, flag string) (*initModel, error) {
	im := &initModel{path: path, flag: flag}
	isHF, hfErr := hf.ProbeDir(path)
	if isHF {
		cfg, err := hf.ReadConfig(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		im.hf, im.shape = cfg, cfg.Shape
		return im, nil
	}
	dir, _, note, err := resolveCheckpoint(path)
	var m *checkpoint.Manifest
	if err == nil {
		m, dir, err = checkpoint.ReadManifest(dir)
	}
	if err != nil && hfErr != nil {
		// Not a checkpoint, and its config.json does not read: that is the
		// news (a Hugging Face directory with a typo in config.json).
		return nil, fmt.Errorf("%s %s: %w", flag, path, hfErr)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s is neither a Hugging Face model directory (a config.json with \"architectures\") nor a Strata checkpoint: %w", flag, path, err)
	}
	if m.Model != "" {
		return nil, fmt.Errorf("%s %s is a checkpoint of %q, a model a Go program defines (engine.Options.Model), which strata cannot build; start it from Go (docs/library.md)", flag, path, m.Model)
	}
	im.ckpt, im.shape, im.source, im.note = dir, m.Shape, m.Source, note
	abs, _ := filepath.Abs(dir)
	if im.source == nil {
		im.source = &hf.Source{Path: abs, Format: hf.SourceStrata}
	} else {
		// The weights are this checkpoint's, the tokenizer its source's.
		s := *im.source
		s.Init, s.Adapter = abs, ""
		im.source = &s
	}
	return im, nil
}

// describe is the model for the run's header.
func (im *initModel) describe() string {
	if im.hf != nil {
		tok := "no tokenizer.json"
		if p := im.source.TokenizerPath(); p != "" {
			tok = "tokenizer " + p
		}
		return fmt.Sprintf("%s (Hugging Face %s, %s weights; %s)", im.path, im.hf.Architecture, orUnknown(im.hf.TorchDType), tok)
	}
	s := fmt.Sprintf("%s (the weights of Strata checkpoint %s; not its optimizer state or step)", im.path, im.ckpt)
	if im.note != "" {
		s += "\nnote: " + im.note // "latest" unreadable: the newest complete checkpoint was taken
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "torch_dtype unknown"
	}
	return s
}

// loadConfig parses the --config file at path for the model of --init: a
// file without strata.model takes the model's shape (so that "auto" values
// follow its hidden size); one with a strata.model of another shape is
// refused, naming both.
func (im *initModel) loadConfig(path string, opts config.Options) (*config.Config, error) {
	named, err := configNamesModel(path)
	if err != nil {
		return nil, err
	}
	lookup := opts.LookupShape
	opts.LookupShape = func(name string) (config.Shape, error) {
		if !named && name == config.DefaultModel {
			return config.Shape(im.shape), nil
		}
		return lookup(name)
	}
	cfg, err := config.Load(path, opts)
	if err != nil {
		return nil, err
	}
	if s := cfg.Shape(); named && s != nil && model.Shape(*s).Canonical() != im.shape.Canonical() {
		return nil, usagef("train: --init %s is %v (from %s), but --config %s sets strata.model to %v: the shape comes from --init; remove strata.model from the config",
			im.path, im.shape, im.shapeFile(), path, model.Shape(*s))
	}
	return cfg, nil
}

// shapeFile is the file the shape of --init was read from.
func (im *initModel) shapeFile() string {
	if im.hf != nil {
		return filepath.Join(im.path, hf.ConfigName)
	}
	return filepath.Join(im.ckpt, checkpoint.ManifestName)
}

// configNamesModel says whether the config file at path sets
// strata.model. A file that does not read as JSON says no; config.Load
// reports it.
func configNamesModel(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("train: --config: %w", err)
	}
	var probe struct {
		Strata struct {
			Model json.RawMessage `json:"model"`
		} `json:"strata"`
	}
	if json.Unmarshal(b, &probe) != nil {
		return false, nil
	}
	m := strings.TrimSpace(string(probe.Strata.Model))
	return m != "" && m != "null", nil
}

// demo makes the demonstration's config (no --config) train this model.
func (im *initModel) demo(cfg *config.Config) {
	cfg.Strata.Model = config.ModelSpec{}
	cfg.ResolveModel(config.Shape(im.shape))
	cfg.Strata.SeqLen = min(cfg.Strata.SeqLen, im.shape.MaxSeq)
}

// apply sets the model of cfg to this one (with its name, written out in
// config.json and every checkpoint, so that a resumed run needs no --init)
// and checks the run's sequence against a sliding window.
func (im *initModel) apply(cfg *config.Config) error {
	s := config.Shape(im.shape)
	cfg.Strata.Model = config.ModelSpec{Shape: &s}
	return nil
}

// open opens the weights: every file's header checked against the shape
// (a Hugging Face directory), or every rank file's size and CRC-32C (a
// Strata checkpoint); nothing else is read until the engine asks for a
// chunk.
func (im *initModel) open() error {
	if im.hf != nil {
		m, err := hf.Open(im.path)
		if err != nil {
			return fmt.Errorf("%s: %w", im.flag, err)
		}
		im.src, im.source = m, m.Source()
		return nil
	}
	rd, err := checkpoint.Open(im.ckpt)
	if err != nil {
		return fmt.Errorf("%s: %w", im.flag, err)
	}
	im.src = rd
	return nil
}

// close closes the weights (after the engine has read them).
func (im *initModel) close() {
	if im != nil && im.src != nil {
		im.src.Close()
		im.src = nil
	}
}
