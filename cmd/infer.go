package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tokenizer"
	"github.com/urfave/cli/v2"
)

// What eval and generate share: the model of --model (a Hugging Face
// directory, a Strata run directory or checkpoint, opened as train --init
// opens one: probeModel, initModel.open) loaded resident on one device,
// chunk by chunk, with its tokenizer, and a model.Decoder sized for the
// command.

// inferFlags are the flags eval and generate share.
func inferFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "model", Required: true, Usage: "a Hugging Face model directory, or a Strata run directory or checkpoint (as train --init and --resume name one)"},
		&cli.StringFlag{Name: "backend", Value: "cpu", Usage: "device backend: cpu, or cuda (one GPU)"},
		&cli.StringFlag{Name: "hbm", Usage: "the device's memory budget (default: cpu 8GiB, cuda the GPU's free memory)"},
		&cli.StringFlag{Name: "dtype", Value: "auto", Usage: "parameter dtype on the device: auto (fp32 for weights stored in F32 or F16, bf16 for weights stored in BF16), fp32 or bf16"},
	}
}

// inferModel is a model loaded for inference: its weights resident on
// one device, its tokenizer, and a decoder.
type inferModel struct {
	im      *initModel
	layout  *model.Layout
	dt      gpu.DType
	dtWhy   string // why dt: what the weights are stored in, or the flag
	tok     *tokenizer.Tokenizer
	tokFrom string // the tokenizer's file, or "bytes"
	// byteTok: tok is the byte tokenizer (no tokenizer.json), which a
	// data file is read with as training reads it (data.Bytes).
	byteTok bool
	// source is the source the tokenizer came from (a checkpoint's own,
	// else its run's recorded one): train's data reader takes its chat
	// template from it (runChat).
	source *hf.Source
	devs   *backend.Devices
	dev    gpu.Device
	w      *model.Weights
	dec    *model.Decoder
}

// openInference opens the model of c's --model for cmd ("eval",
// "generate"), chooses the parameter dtype and the tokenizer, opens one
// device of --backend, refuses a model whose parameters and decoder
// (decoderOpts of the shape and tokenizer) do not fit its memory, and
// loads the weights a chunk at a time. decoderOpts sees the model with its
// shape and tokenizer, before any device is opened; nil: the caller streams
// the weights itself (eval --offload: an inference engine), and openInference
// stops once the device is open. Notes go to stderr.
func openInference(c *cli.Context, cmd string, decoderOpts func(*inferModel) (model.DecoderOptions, error), stderr io.Writer) (_ *inferModel, err error) {
	name := c.String("backend")
	if !slices.Contains(backend.Names, name) {
		return nil, usagef("%s: --backend %q is not one of %s", cmd, name, strings.Join(backend.Names, ", "))
	}
	var hbm int64
	if v := c.String("hbm"); v != "" {
		if hbm, err = units.ParseBytes(v); err != nil || hbm == 0 {
			return nil, usagef("%s: --hbm %q: want a byte size such as 16GiB (%v)", cmd, v, err)
		}
		if name == "cpu" {
			if err := cpu.CheckHostRAM(1, hbm); err != nil {
				return nil, fmt.Errorf("%s: %w", cmd, err)
			}
		}
	}
	dtFlag := c.String("dtype")
	if dtFlag != "auto" && dtFlag != "fp32" && dtFlag != "bf16" {
		return nil, usagef("%s: --dtype %q: want auto, fp32 or bf16", cmd, dtFlag)
	}
	im, err := probeModel(c.String("model"), cmd+": --model")
	if err != nil {
		return nil, err
	}
	if err := im.open(); err != nil {
		return nil, err
	}
	m := &inferModel{im: im}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	if m.layout, err = model.NewLayout(im.shape); err != nil {
		return nil, fmt.Errorf("%s: --model %s: %w", cmd, im.path, err)
	}
	if m.dt, m.dtWhy, err = paramDType(im, dtFlag); err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	if err := m.openTokenizer(cmd); err != nil {
		return nil, err
	}
	var opts model.DecoderOptions
	if decoderOpts != nil {
		if opts, err = decoderOpts(m); err != nil {
			return nil, err
		}
	}
	if m.devs, err = backend.Open(name, 1, hbm, true); err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	m.dev = m.devs.Devs[0]
	if decoderOpts == nil {
		fmt.Fprintf(stderr, "model: %s\n", im.describe())
		return m, nil
	}
	if err := m.checkFits(cmd, opts); err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "model: %s\n", im.describe())
	fmt.Fprintf(stderr, "params %s (%s), activations and key/value cache fp32; tokenizer %s; %s\n", m.dt, m.dtWhy, m.tokFrom, m.devs.Describe)
	start := time.Now()
	if err := m.load(cmd); err != nil {
		return nil, err
	}
	if m.dec, err = model.NewDecoder(m.dev, m.layout, opts); err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	fmt.Fprintf(stderr, "loaded %s parameters in %.1fs; %s holds them (%s) and %s of activations and key/value cache for %d tokens\n",
		formatCount(m.layout.ParamCount()), time.Since(start).Seconds(), m.dev.Name(), units.FormatBytes(model.WeightsBytes(m.layout, m.dt)),
		units.FormatBytes(model.DecoderBytes(im.shape, opts)), opts.Capacity)
	return m, nil
}

// formatCount prints a parameter count: 124.4M, 8.03B.
func formatCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// paramDType is the dtype the parameters are held in: --dtype, or for
// auto bf16 when every weight tensor is stored in BF16 (a Hugging Face
// directory's files; a Strata checkpoint's params without master
// weights) and fp32 otherwise (F32, or F16, which fp32 holds exactly and
// bf16 does not), with the reason.
func paramDType(im *initModel, flag string) (gpu.DType, string, error) {
	switch flag {
	case "fp32":
		return gpu.F32, "--dtype fp32", nil
	case "bf16":
		return gpu.BF16, "--dtype bf16", nil
	}
	switch src := im.src.(type) {
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

// openTokenizer loads the tokenizer.json of the model's source (a Hugging
// Face directory's own; a Strata checkpoint's, or its run directory's
// run.json's, recorded source), else the byte tokenizer for a vocabulary
// of 256; anything else is refused.
func (m *inferModel) openTokenizer(cmd string) error {
	src := m.im.source
	if src.TokenizerPath() == "" && m.im.ckpt != "" {
		if rf, err := readRunFile(m.im.path); err == nil && rf != nil && rf.Source != nil {
			src = rf.Source
		}
	}
	vocab := m.im.shape.Vocab
	m.source = src
	if p := src.TokenizerPath(); p != "" {
		tok, err := tokenizer.Load(p)
		if err != nil {
			return fmt.Errorf("%s: --model %s: %w", cmd, m.im.path, err)
		}
		if tok.VocabSize() > vocab {
			return fmt.Errorf("%s: --model %s: %s has ids up to %d, the model's vocabulary is %d", cmd, m.im.path, p, tok.VocabSize()-1, vocab)
		}
		m.tok, m.tokFrom = tok, p
		return nil
	}
	if vocab == 256 {
		m.tok, m.tokFrom, m.byteTok = tokenizer.Bytes(), "bytes (one id per byte: the model's vocabulary is 256 and it has no tokenizer.json)", true
		return nil
	}
	return fmt.Errorf("%s: --model %s has no tokenizer.json (its source: %s) and a vocabulary of %d, not the byte vocabulary of 256: put the model's tokenizer.json beside its config.json",
		cmd, m.im.path, describeSource(src), vocab)
}

// recordedChat is the chat template the model's checkpoint recorded (the
// run trained on it), nil for a Hugging Face directory or a run without
// one.
func (m *inferModel) recordedChat() *data.ChatTemplate {
	if rd, ok := m.im.src.(*checkpoint.Reader); ok {
		return rd.ChatTemplate()
	}
	return nil
}

// runSeqLen is the seq_len the model's run trained with (its
// checkpoint's config), 0 for a Hugging Face directory.
func (m *inferModel) runSeqLen() int {
	rd, ok := m.im.src.(*checkpoint.Reader)
	if !ok {
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

func describeSource(s *hf.Source) string {
	if s == nil {
		return "none recorded"
	}
	return s.Path + " (" + s.Format + ")"
}

// checkFits refuses a model whose parameters and decoder do not fit the
// device's free memory, saying what each needs.
func (m *inferModel) checkFits(cmd string, opts model.DecoderOptions) error {
	params := model.WeightsBytes(m.layout, m.dt)
	dec := model.DecoderBytes(m.im.shape, opts)
	ms := m.dev.MemStats()
	free := ms.BudgetBytes - ms.InUseBytes
	if params+dec <= free {
		return nil
	}
	return fmt.Errorf("%s: the model needs %s on the device: its %s parameters in %s (%s) and %s of activations and key/value cache for %d tokens; %s has %s: "+
		"use a device with more memory (the CPU backend: --hbm), --dtype bf16 or fewer tokens, or (eval) stream the weights through host RAM or NVMe with --offload cpu or --offload nvme --nvme-path DIR",
		cmd, units.FormatBytes(params+dec), formatCount(m.layout.ParamCount()), m.dt, units.FormatBytes(params), units.FormatBytes(dec),
		opts.Capacity, m.dev.Name(), units.FormatBytes(free))
}

// load allocates the weights on the device and uploads them a chunk at a
// time: host memory holds one chunk in fp32 and its staging copy.
func (m *inferModel) load(cmd string) error {
	w, err := model.NewWeights(m.dev, m.layout, m.dt)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	m.w = w
	longest := 0
	for _, ch := range m.layout.Chunks {
		longest = max(longest, ch.Len)
	}
	buf := make([]float32, longest)
	s := m.dev.DefaultStream()
	for c, ch := range m.layout.Chunks {
		if err := m.im.src.ReadChunk(c, buf[:ch.Len]); err != nil {
			return fmt.Errorf("%s: --model %s: %w", cmd, m.im.path, err)
		}
		w.LoadChunk(s, c, buf[:ch.Len])
		if err := s.Synchronize(); err != nil {
			return fmt.Errorf("%s: upload chunk %d: %w", cmd, c, err)
		}
	}
	return nil
}

// close frees the device memory and closes the backend and the files.
func (m *inferModel) close() {
	if m.dev != nil {
		m.dev.DefaultStream().Synchronize()
	}
	if m.dec != nil {
		m.dec.Free()
	}
	if m.w != nil {
		m.w.Free()
	}
	if m.devs != nil {
		m.devs.Close()
	}
	m.im.close()
}
