package cmd

import (
	"context"
	"fmt"

	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/source"
)

// initModel is the model of `strata train --init PATH` (and eval and
// generate's --model): a source.Model, a Hugging Face model directory or
// a Strata checkpoint, with its fields under the names train, export and
// adapter read. probeInit reads its shape before the config is resolved
// (the shape comes from PATH); open opens its weights for the engine
// (engine.Options.Init), which reads them one chunk at a time.
type initModel struct {
	m     *source.Model
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
	src    source.Weights
}

// probeInit reads the shape of the model at path: config.json of a Hugging
// Face directory, else the manifest of a Strata checkpoint.
func probeInit(path string) (*initModel, error) { return probeModel(path, "train: --init") }

// probeModel is probeInit for the command and flag flag (eval and
// generate's --model).
func probeModel(path, flag string) (*initModel, error) {
	m, err := source.Probe(context.Background(), path, source.Options{Name: flag})
	if err != nil {
		return nil, err
	}
	im := &initModel{m: m}
	im.sync()
	return im, nil
}

// sync copies the library's fields.
func (im *initModel) sync() {
	m := im.m
	im.path, im.flag, im.shape, im.hf, im.ckpt, im.note, im.source, im.src = m.Path, m.Name, m.Shape, m.HF, m.Checkpoint, m.Note, m.Source, m.Weights()
}

// describe is the model for the run's header.
func (im *initModel) describe() string { return im.m.Describe() }

// shapeFile is the file the shape of --init was read from.
func (im *initModel) shapeFile() string { return im.m.ShapeFile() }

// configNamesModel says whether the config file at path sets
// strata.model (source.ConfigNamesModel).
func configNamesModel(path string) (bool, error) {
	named, err := source.ConfigNamesModel(path)
	if err != nil {
		return false, fmt.Errorf("train: --config: %w", err)
	}
	return named, nil
}

// open opens the weights: every file's header checked against the shape
// (a Hugging Face directory), or every rank file's size and CRC-32C (a
// Strata checkpoint); nothing else is read until the engine asks for a
// chunk.
func (im *initModel) open() error {
	err := im.m.Open(context.Background())
	im.sync()
	return err
}

// close closes the weights (after the engine has read them).
func (im *initModel) close() {
	if im != nil {
		im.m.Close()
		im.src = nil
	}
}
