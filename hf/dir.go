package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// Model is an open Hugging Face model directory: config.json read into
// a shape, and every weight file's header checked against the shape's
// layout (each tensor's name, shape and dtype), nothing else read yet.
// ReadChunk then reads one chunk at a time, so a model larger than host
// memory passes through it a chunk at a time. Close it when done. Not safe
// for concurrent use.
type Model struct {
	Dir    string
	Config *Config
	Layout *model.Layout
	// Files are the weight files: model.safetensors, or the shards the
	// index names (sorted).
	Files []string
	// Tokenizer are the files of TokenizerFiles the directory holds.
	Tokenizer []string
	w         *weights
}

// Open opens the Hugging Face model directory dir: config.json (see
// ParseConfig), then the weights, model.safetensors or else the shards
// model.safetensors.index.json names. Tensors are F32, BF16 or F16 (read
// as fp32, each value exactly), named as transformers names them, with or
// without the "model." (Llama family) or "transformer." (GPT-2) prefix;
// GPT-2's Conv1D weights are stored in×out. What is not the layout's is
// refused in one error that names the directory and lists every problem,
// each with its file and tensor: a tensor missing, in two places, of the
// wrong shape or dtype, one the layout lacks, an index entry that its file
// does not hold. Skipped: attention-mask and rotary buffers, and an
// lm_head.weight the config ties to the embedding.
func Open(dir string) (_ *Model, err error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	l, err := model.NewLayout(cfg.Shape)
	if err != nil {
		return nil, fmt.Errorf("hf: %s: %w", filepath.Join(dir, ConfigName), err)
	}
	m := &Model{Dir: dir, Config: cfg, Layout: l}
	index, err := m.findWeights()
	if err != nil {
		return nil, err
	}
	files := make([]*safetensors.File, 0, len(m.Files))
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
		}
	}()
	for _, name := range m.Files {
		f, err := safetensors.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	prefix := "transformer."
	if cfg.Shape.IsLlama() {
		prefix = "model."
	}
	prefixed := false
	for _, f := range files {
		for _, t := range f.Header.Tensors {
			prefixed = prefixed || strings.HasPrefix(t.Name, prefix)
		}
	}
	display := func(n string) string { return n }
	if prefixed {
		display = func(n string) string { return hfPrefixed(cfg.Shape, n) }
	}
	w, problems := matchWeights(l, files, weightNames{names: NamesHF, canon: hfCanon(cfg.Shape), display: display})
	problems = append(problems, checkIndex(index, files)...)
	if len(problems) > 0 {
		return nil, fmt.Errorf("hf: import Hugging Face model %s (%s): %s", dir, describeHF(cfg), strings.Join(problems, "; "))
	}
	m.w = w
	for _, name := range TokenizerFiles {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode().IsRegular() {
			m.Tokenizer = append(m.Tokenizer, name)
		}
	}
	return m, nil
}

func describeHF(c *Config) string {
	s := c.Shape
	return fmt.Sprintf("%s, L=%d C=%d H=%d KV=%d V=%d", c.Architecture, s.Layers, s.Dim, s.Heads, s.KVHeadCount(), s.Vocab)
}

// findWeights sets m.Files: model.safetensors when there is one (as
// transformers prefers it), else the files of the index, whose weight_map
// it returns.
func (m *Model) findWeights() (map[string]string, error) {
	single := filepath.Join(m.Dir, WeightsName)
	if _, err := os.Stat(single); err == nil {
		m.Files = []string{WeightsName}
		return nil, nil
	}
	indexPath := filepath.Join(m.Dir, IndexName)
	b, err := os.ReadFile(indexPath)
	if errors.Is(err, fs.ErrNotExist) {
		hint := ""
		for _, other := range []string{"pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "consolidated.00.pth"} {
			if _, err := os.Stat(filepath.Join(m.Dir, other)); err == nil {
				hint = fmt.Sprintf(" (it holds %s: Strata reads safetensors only; convert it, e.g. with transformers' save_pretrained(..., safe_serialization=True))", other)
				break
			}
		}
		return nil, fmt.Errorf("hf: %s holds neither %s nor %s%s", m.Dir, WeightsName, IndexName, hint)
	}
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &index); err != nil || len(index.WeightMap) == 0 {
		return nil, fmt.Errorf("hf: %s: not an index with a weight_map of tensor names to files (%v)", indexPath, err)
	}
	seen := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(index.WeightMap)) { // sorted: the same input names the same tensor
		file := index.WeightMap[name]
		if file == "" || filepath.Base(file) != file || file == "." || file == ".." {
			return nil, fmt.Errorf("hf: %s: tensor %q is in %q, which is not a file name in the directory", indexPath, name, file)
		}
		if !seen[file] {
			seen[file] = true
			m.Files = append(m.Files, file)
		}
	}
	sort.Strings(m.Files)
	return index.WeightMap, nil
}

// checkIndex lists the index entries whose file does not hold the tensor.
func checkIndex(index map[string]string, files []*safetensors.File) []string {
	if index == nil {
		return nil
	}
	holds := map[string]map[string]bool{}
	for _, f := range files {
		names := map[string]bool{}
		for _, t := range f.Header.Tensors {
			names[t.Name] = true
		}
		holds[shortPath(f.Path)] = names
	}
	var bad []string
	for name, file := range index {
		if !holds[file][name] {
			bad = append(bad, fmt.Sprintf("%s (in %s)", name, file))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return []string{fmt.Sprintf("%s lists %d tensors their file does not hold: %s", IndexName, len(bad), listSome(bad))}
}

// Shape is the model's shape.
func (m *Model) Shape() model.Shape { return m.Config.Shape }

// ReadChunk fills dst, exactly the length of chunk c of the layout, with
// the chunk's values as fp32: each tensor read from its file with pread, a
// block of at most 4 MiB at a time (an F32 tensor the layout stores as the
// file does, straight into dst), so host memory holds the caller's chunk
// and one block, whatever the model's size; the page cache holds what the
// kernel keeps of the files.
func (m *Model) ReadChunk(c int, dst []float32) error {
	if err := m.w.readChunk(c, dst); err != nil {
		return fmt.Errorf("%w (chunk %d, %s)", err, c, m.Layout.Chunks[c].Name)
	}
	return nil
}

// Source is the model as a run's Source: where its tokenizer files are.
func (m *Model) Source() *Source {
	dir, err := filepath.Abs(m.Dir)
	if err != nil {
		dir = m.Dir
	}
	return &Source{Path: dir, Format: SourceHF, Tokenizer: m.Tokenizer}
}

// Close closes the weight files.
func (m *Model) Close() error {
	var errs []error
	for _, f := range m.w.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// Source is where a run's initial weights came from (`strata train
// --init`), recorded in each of its checkpoints' manifests (and in the
// run's run.json) so that the run's tokenizer and, for a Hugging Face
// model, its config.json can be found again (`strata export --format hf`
// copies them).
type Source struct {
	Path   string `json:"path"`   // absolute
	Format string `json:"format"` // SourceHF or SourceStrata
	// Tokenizer are the files of TokenizerFiles in Path (a Hugging Face
	// directory); tokenizer.json is what the data pipeline reads.
	Tokenizer []string `json:"tokenizer,omitempty"`
	// Init is the Strata checkpoint directory (absolute) the run's
	// weights were read from when Path is not it: a checkpoint whose own
	// run recorded Path as its source. "" otherwise (Path is the model
	// the weights came from). BaseModel says which.
	Init string `json:"init,omitempty"`
	// Adapter is the PEFT adapter directory (absolute) the run's LoRA
	// adapters started from (`strata train --adapter`); "" for adapters
	// of the seeded initialisation.
	Adapter string `json:"adapter,omitempty"`
}

// BaseModel is the model the run's weights were initialised from: Init
// when set, else Path; "" for a nil Source (the seeded initialisation).
// An exported PEFT adapter names it as its base_model_name_or_path.
func (s *Source) BaseModel() string {
	switch {
	case s == nil:
		return ""
	case s.Init != "":
		return s.Init
	}
	return s.Path
}

// Source formats.
const (
	SourceHF     = "hf"     // a Hugging Face model directory
	SourceStrata = "strata" // a Strata checkpoint without a Source of its own
)

// TokenizerPath is the path of Path's tokenizer.json, "" when the source
// has none.
func (s *Source) TokenizerPath() string {
	return s.file("tokenizer.json")
}

// TokenizerConfigPath is the path of Path's tokenizer_config.json, "" when
// the source has none.
func (s *Source) TokenizerConfigPath() string {
	return s.file("tokenizer_config.json")
}

func (s *Source) file(name string) string {
	if s == nil {
		return ""
	}
	for _, t := range s.Tokenizer {
		if t == name {
			return filepath.Join(s.Path, name)
		}
	}
	return ""
}
