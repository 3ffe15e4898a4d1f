package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tokenizer"
)

// Weights are a model's weights read one chunk at a time: an
// engine.ChunkSource (engine.Options.Init) that is closed after use.
type Weights interface {
	Shape() model.Shape
	ReadChunk(c int, dst []float32) error
	io.Closer
}

// Model is a model named by a path: its shape, read by Probe, and its
// weights, opened by Open.
type Model struct {
	// Path is the path as given.
	Path string
	// Name is how errors name the model ("train: --init", "eval: --model").
	Name string
	// Shape is the model's shape: config.json's, or the checkpoint's
	// manifest's.
	Shape model.Shape
	// HF is the config.json of a Hugging Face directory; nil for a
	// checkpoint.
	HF *hf.Config
	// Checkpoint is the directory of a Strata checkpoint; "" for a
	// Hugging Face directory.
	Checkpoint string
	// Note says how Checkpoint was found when "latest" could not be read
	// (checkpoint.Find): the newest complete checkpoint was taken.
	Note string
	// Source is what a run records (run.json, every checkpoint's
	// manifest): the Hugging Face directory and its tokenizer files, or
	// the Source of the checkpoint's own run.
	Source *hf.Source
	w      Weights
}

// Options are Probe's options.
type Options struct {
	// Name is how errors name the model: the command and flag that gave
	// the path ("train: --init"). Default "model".
	Name string
}

// Probe reads the shape of the model at path: config.json of a Hugging
// Face directory, else the manifest of a Strata checkpoint (FindCheckpoint).
// A checkpoint of a model a Go program defines (engine.Options.Model) is
// refused: its shape is not one Strata can build.
func Probe(ctx context.Context, path string, opts Options) (*Model, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	flag := opts.Name
	if flag == "" {
		flag = "model"
	}
	im := &Model{Path: path, Name: flag}
	isHF, hfErr := hf.ProbeDir(path)
	if isHF {
		cfg, err := hf.ReadConfig(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		im.HF, im.Shape = cfg, cfg.Shape
		return im, nil
	}
	dir, _, note, err := FindCheckpoint(path)
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
	im.Checkpoint, im.Shape, im.Source, im.Note = dir, m.Shape, m.Source, note
	abs, _ := filepath.Abs(dir)
	if im.Source == nil {
		im.Source = &hf.Source{Path: abs, Format: hf.SourceStrata}
	} else {
		// The weights are this checkpoint's, the tokenizer its source's.
		s := *im.Source
		s.Init, s.Adapter = abs, ""
		im.Source = &s
	}
	return im, nil
}

// FindCheckpoint finds the checkpoint a user names, the same way for
// train --resume, inspect and export: a checkpoint directory (step-N), its
// manifest.json, a directory of checkpoints (its "latest") or a run's --out
// directory (the "latest" of its checkpoints/). It returns the checkpoint's
// directory, the directory of checkpoints holding it ("" when path named
// the checkpoint itself), and a note for the user when "latest" was
// missing or unreadable and the newest complete checkpoint was taken
// instead (checkpoint.Locate).
func FindCheckpoint(path string) (dir, list, note string, err error) {
	return checkpoint.Locate(path)
}

// Describe is the model in one line for a run's header (with a second,
// the note, when "latest" could not be read).
func (im *Model) Describe() string {
	if im.HF != nil {
		tok := "no tokenizer.json"
		if p := im.Source.TokenizerPath(); p != "" {
			tok = "tokenizer " + p
		}
		return fmt.Sprintf("%s (Hugging Face %s, %s weights; %s)", im.Path, im.HF.Architecture, orUnknown(im.HF.TorchDType), tok)
	}
	s := fmt.Sprintf("%s (the weights of Strata checkpoint %s; not its optimizer state or step)", im.Path, im.Checkpoint)
	if im.Note != "" {
		s += "\nnote: " + im.Note // "latest" unreadable: the newest complete checkpoint was taken
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "torch_dtype unknown"
	}
	return s
}

// ShapeFile is the file the shape was read from.
func (im *Model) ShapeFile() string {
	if im.HF != nil {
		return filepath.Join(im.Path, hf.ConfigName)
	}
	return filepath.Join(im.Checkpoint, checkpoint.ManifestName)
}

// Open opens the weights: every file's header checked against the shape
// (a Hugging Face directory), or every rank file's size and CRC-32C (a
// Strata checkpoint); nothing else is read until a chunk is asked for.
// ctx is checked before the files are read.
func (im *Model) Open(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if im.HF != nil {
		m, err := hf.Open(im.Path)
		if err != nil {
			return fmt.Errorf("%s: %w", im.Name, err)
		}
		im.w, im.Source = m, m.Source()
		return nil
	}
	rd, err := checkpoint.Open(im.Checkpoint)
	if err != nil {
		return fmt.Errorf("%s: %w", im.Name, err)
	}
	im.w = rd
	return nil
}

// Weights are the opened weights (an engine.ChunkSource); nil before Open
// and after Close.
func (im *Model) Weights() Weights { return im.w }

// Close closes the weights (after the engine has read them). A nil Model,
// or one not opened, closes as a no-op.
func (im *Model) Close() error {
	if im == nil || im.w == nil {
		return nil
	}
	err := im.w.Close()
	im.w = nil
	return err
}

// reader is the checkpoint's reader, nil for a Hugging Face directory or
// before Open.
func (im *Model) reader() *checkpoint.Reader {
	rd, _ := im.w.(*checkpoint.Reader)
	return rd
}

// TokenizerSource is the source the tokenizer comes from: the model's
// own, else (a checkpoint whose manifest names none) the one its run
// directory's run.json recorded.
func (im *Model) TokenizerSource() *hf.Source {
	src := im.Source
	if src.TokenizerPath() == "" && im.Checkpoint != "" {
		if rs := runSource(im.Path); rs != nil {
			src = rs
		}
	}
	return src
}

// runSource is the source dir/run.json records; nil without one.
func runSource(dir string) *hf.Source {
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		return nil
	}
	var rf struct {
		Source *hf.Source `json:"source"`
	}
	if json.Unmarshal(b, &rf) != nil {
		return nil
	}
	return rf.Source
}

// Tokenizer is the model's tokenizer: the tokenizer.json of
// TokenizerSource, else the byte tokenizer for a vocabulary of 256;
// anything else is refused. from names its file ("bytes (...)" for the
// byte tokenizer), and bytes says it is the byte tokenizer (data files
// are then read with data.Bytes, as training reads them).
func (im *Model) Tokenizer() (tok *tokenizer.Tokenizer, from string, bytes bool, err error) {
	src := im.TokenizerSource()
	vocab := im.Shape.Vocab
	if p := src.TokenizerPath(); p != "" {
		tok, err := tokenizer.Load(p)
		if err != nil {
			return nil, "", false, fmt.Errorf("%s %s: %w", im.Name, im.Path, err)
		}
		if tok.VocabSize() > vocab {
			return nil, "", false, fmt.Errorf("%s %s: %s has ids up to %d, the model's vocabulary is %d", im.Name, im.Path, p, tok.VocabSize()-1, vocab)
		}
		return tok, p, false, nil
	}
	if vocab == 256 {
		return tokenizer.Bytes(), "bytes (one id per byte: the model's vocabulary is 256 and it has no tokenizer.json)", true, nil
	}
	return nil, "", false, fmt.Errorf("%s %s has no tokenizer.json (its source: %s) and a vocabulary of %d, not the byte vocabulary of 256: put the model's tokenizer.json beside its config.json",
		im.Name, im.Path, describeSource(src), vocab)
}

func describeSource(s *hf.Source) string {
	if s == nil {
		return "none recorded"
	}
	return s.Path + " (" + s.Format + ")"
}

// RecordedChat is the chat template the model's checkpoint recorded (its
// run trained on it); nil for a Hugging Face directory, a run without
// one, or before Open.
func (im *Model) RecordedChat() *data.ChatTemplate {
	if rd := im.reader(); rd != nil {
		return rd.ChatTemplate()
	}
	return nil
}

// ChatTemplate is the chat template of the model's conversations, as
// training takes it when no template is given: the one its run recorded
// (RecordedChat), else the one of the Hugging Face directory its weights
// or its run came from, else ChatML (data.DefaultChatTemplate). Call it
// after Open.
func (im *Model) ChatTemplate() (*data.ChatTemplate, error) {
	return ChatTemplate(im.TokenizerSource(), im.RecordedChat())
}

// ChatTemplate is the chat template of a run whose weights came from
// source (nil: none recorded) and whose checkpoint recorded recorded (nil:
// none): recorded, else source's when it is a Hugging Face directory
// (tokenizer_config.json, chat_template.jinja), else ChatML.
func ChatTemplate(source *hf.Source, recorded *data.ChatTemplate) (*data.ChatTemplate, error) {
	if recorded != nil {
		if recorded.Text() == data.ChatMLTemplate {
			return data.DefaultChatTemplate(), nil
		}
		chat, err := data.ParseChatTemplate(recorded.Text(), recorded.Source()+" (recorded by the run)", recorded.SpecialTokens())
		if err != nil {
			return nil, fmt.Errorf("the run's chat template: %w", err)
		}
		return chat, nil
	}
	if source == nil || source.Format != hf.SourceHF {
		return data.DefaultChatTemplate(), nil
	}
	chat, err := data.LoadChatTemplate(source.Path)
	if errors.Is(err, fs.ErrNotExist) { // no tokenizer_config.json
		return data.DefaultChatTemplate(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("the model's chat template: %w", err)
	}
	return chat, nil
}

// EOS are the ids config.json's eos_token_id names (one id or a list) —
// of the Hugging Face directory, or of the one a checkpoint's run started
// from — where generation stops as transformers' generate stops; nil when
// it names none or there is no config.json to read.
func (im *Model) EOS() []int32 {
	if im.HF != nil {
		return im.HF.EOS
	}
	src := im.TokenizerSource()
	if src == nil || src.Format != hf.SourceHF {
		return nil
	}
	cfg, err := hf.ReadConfig(src.Path)
	if err != nil {
		return nil
	}
	return cfg.EOS
}

// RunSeqLen is the seq_len the model's run trained with (its
// checkpoint's config); 0 for a Hugging Face directory or before Open.
func (im *Model) RunSeqLen() int {
	rd := im.reader()
	if rd == nil {
		return 0
	}
	var cfg struct {
		Strata struct {
			SeqLen int `json:"seq_len"`
		} `json:"strata"`
	}
	if json.Unmarshal(rd.State().Config, &cfg) != nil {
		return 0
	}
	return cfg.Strata.SeqLen
}

// ParamDType is the dtype to hold the parameters in when none is asked
// for, with the reason: bf16 when every weight tensor is stored in BF16
// (a Hugging Face directory's files; a Strata checkpoint's params without
// master weights) and fp32 otherwise (F32, or F16, which fp32 holds
// exactly and bf16 does not). Call it after Open.
func (im *Model) ParamDType() (gpu.DType, string, error) {
	switch src := im.w.(type) {
	case *hf.Model:
		dts := map[string]bool{}
		for _, name := range src.Files {
			f, err := safetensors.Open(filepath.Join(src.Dir, name))
			if err != nil {
				return 0, "", err
			}
			for _, t := range f.Header.Tensors {
				dts[t.DType] = true
			}
			f.Close()
		}
		if len(dts) == 1 && dts["BF16"] {
			return gpu.BF16, "the weights are stored in BF16", nil
		}
		return gpu.F32, "the weights are stored in " + strings.Join(slices.Sorted(maps.Keys(dts)), ", "), nil
	case *checkpoint.Reader:
		st := src.State()
		if k := st.StateIndex(shard.Master); k >= 0 {
			return gpu.F32, "the checkpoint's fp32 master weights", nil
		}
		if k := st.StateIndex(shard.Param); k >= 0 && st.States[k].DType == gpu.BF16 {
			return gpu.BF16, "the checkpoint holds bf16 params without master weights", nil
		}
		return gpu.F32, "the checkpoint's fp32 params", nil
	}
	return gpu.F32, "fp32", nil
}
