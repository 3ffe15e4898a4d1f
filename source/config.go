package source

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
)

// LoadConfig parses the config file at path for a run that starts from
// the model: a file without strata.model takes the model's shape (so that
// "auto" values follow its hidden size); one with a strata.model of
// another shape is refused with a *ShapeConflictError naming both.
func (im *Model) LoadConfig(path string, opts config.Options) (*config.Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return im.ParseConfig(b, path, opts)
}

// ParseConfig is LoadConfig of a config held in memory (DeepSpeed JSON;
// name is what errors call it). Without opts.LookupShape, a strata.model
// the config names is looked up among model's named shapes.
func (im *Model) ParseConfig(b []byte, name string, opts config.Options) (*config.Config, error) {
	named := namesModel(b)
	lookup := opts.LookupShape
	if lookup == nil {
		lookup = model.LookupConfigShape
	}
	opts.LookupShape = func(name string) (config.Shape, error) {
		if !named && name == config.DefaultModel {
			return config.Shape(im.Shape), nil
		}
		return lookup(name)
	}
	cfg, err := config.Parse(b, name, opts)
	if err != nil {
		return nil, err
	}
	if s := cfg.Shape(); named && s != nil && model.Shape(*s).Canonical() != im.Shape.Canonical() {
		return nil, &ShapeConflictError{Model: im, ConfigPath: name, ConfigShape: model.Shape(*s)}
	}
	return cfg, nil
}

// ShapeConflictError is a config whose strata.model is not the shape of
// the model the run starts from.
type ShapeConflictError struct {
	Model       *Model
	ConfigPath  string
	ConfigShape model.Shape
}

func (e *ShapeConflictError) Error() string {
	im := e.Model
	return fmt.Sprintf("%s %s is %v (from %s), but --config %s sets strata.model to %v: the shape comes from --init; remove strata.model from the config",
		im.Name, im.Path, im.Shape, im.ShapeFile(), e.ConfigPath, e.ConfigShape)
}

// ConfigNamesModel says whether the config file at path sets
// strata.model. A file that does not read as JSON says no; config.Load
// reports it.
func ConfigNamesModel(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	return namesModel(b), nil
}

// namesModel says whether the config b sets strata.model.
func namesModel(b []byte) bool {
	var probe struct {
		Strata struct {
			Model json.RawMessage `json:"model"`
		} `json:"strata"`
	}
	if json.Unmarshal(b, &probe) != nil {
		return false
	}
	m := strings.TrimSpace(string(probe.Strata.Model))
	return m != "" && m != "null"
}

// Apply sets the model of cfg to this one's shape (written out in
// config.json and every checkpoint, so that a resumed run needs no
// --init).
func (im *Model) Apply(cfg *config.Config) {
	s := config.Shape(im.Shape)
	cfg.Strata.Model = config.ModelSpec{Shape: &s}
}

// Demo makes a default config (no config file) train this model: its
// shape resolved into the config's "auto" values, the sequence at most
// the model's max_seq_len.
func (im *Model) Demo(cfg *config.Config) {
	cfg.Strata.Model = config.ModelSpec{}
	cfg.ResolveModel(config.Shape(im.Shape))
	cfg.Strata.SeqLen = min(cfg.Strata.SeqLen, im.Shape.MaxSeq)
}
