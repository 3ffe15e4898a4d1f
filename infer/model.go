package infer

import (
	"context"
	"errors"
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/source"
	"github.com/strata-ai/strata/tokenizer"
)

// Options are Open's options.
type Options struct {
	// Backend is the device backend: "cpu" (the default) or "cuda" (one
	// GPU).
	Backend string
	// HBMBytes is the device's memory budget; 0: the backend's default
	// (cpu 8 GiB, cuda the GPU's free memory).
	HBMBytes int64
	// DType is the parameter dtype on the device: "" or "auto" (fp32 for
	// weights stored in F32 or F16, bf16 for weights stored in BF16),
	// "fp32" or "bf16".
	DType string
	// Name is how errors name the caller ("eval", "generate"); default
	// "infer".
	Name string
	// Experts is where a mixture of experts' experts live while it runs:
	// "" or ExpertsDevice with the rest of the weights, ExpertsHost in
	// host RAM or ExpertsNVMe in a file under NVMePath. Off the device,
	// only the experts a token reached are read, through a cache of
	// ExpertCache experts on the device under ExpertPolicy (PolicyLRU or
	// PolicyTinyLFU); ExpertStats counts the hits and the bytes read.
	Experts      string
	NVMePath     string
	ExpertCache  int
	ExpertPolicy string
}

// Validate says what of o is not an option Open takes.
func (o Options) Validate() error {
	switch o.DType {
	case "", "auto", "fp32", "bf16":
	default:
		return fmt.Errorf("infer: DType %q: want auto, fp32 or bf16", o.DType)
	}
	switch o.Experts {
	case "", ExpertsDevice, ExpertsHost, ExpertsNVMe:
	default:
		return fmt.Errorf("infer: experts %q: want %s, %s or %s", o.Experts, ExpertsDevice, ExpertsHost, ExpertsNVMe)
	}
	switch o.ExpertPolicy {
	case "", PolicyLRU, PolicyTinyLFU:
	default:
		return fmt.Errorf("infer: expert cache policy %q: want %s or %s", o.ExpertPolicy, PolicyLRU, PolicyTinyLFU)
	}
	if o.ExpertCache < 0 {
		return fmt.Errorf("infer: expert cache of %d experts: want >= 0", o.ExpertCache)
	}
	return nil
}

// Model is a model opened for inference: its weights (source.Model), the
// dtype its parameters are held in, its tokenizer and one device. Load
// puts the weights on the device with a decoder (Evaluate's resident
// path, Generate); Evaluate's streamed path leaves them where they are.
// Close it when done. Not safe for concurrent use.
type Model struct {
	// Source is the model's files: shape, weights, source record.
	Source *source.Model
	// Layout is the shape's chunks.
	Layout *model.Layout
	// DType is the dtype the parameters are held in on the device, and
	// DTypeWhy why (what the weights are stored in, or Options.DType).
	DType    gpu.DType
	DTypeWhy string
	// Tokenizer is the model's tokenizer, read from TokenizerFrom (the
	// byte tokenizer when ByteTokenizer: no tokenizer.json and a
	// vocabulary of 256).
	Tokenizer     *tokenizer.Tokenizer
	TokenizerFrom string
	ByteTokenizer bool
	// TokenizerSource is the source the tokenizer came from (a
	// checkpoint's own, else its run's recorded one): its chat template is
	// the model's (ChatTemplate).
	TokenizerSource *hf.Source
	// Devices is the backend's devices (one), Device the one.
	Devices *backend.Devices
	Device  gpu.Device

	name     string
	dtypeSet bool // Options.DType asked for a dtype
	opts     Options
	w        *model.Weights
	experts  *expertStore // the experts off the device (Options.Experts), or nil
	dec      *model.Decoder
	decOpts  model.DecoderOptions
}

// Open opens the model at path (a Hugging Face directory or a Strata run
// or checkpoint, as source.Probe names one) for inference: its weights
// opened (nothing read yet), the parameter dtype chosen, its tokenizer
// loaded and one device of opts.Backend opened.
func Open(ctx context.Context, path string, opts Options) (_ *Model, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cmd := opts.Name
	if cmd == "" {
		cmd = "infer"
	}
	im, err := source.Probe(ctx, path, source.Options{Name: cmd + ": --model"})
	if err != nil {
		return nil, err
	}
	if err := im.Open(ctx); err != nil {
		return nil, err
	}
	m := &Model{Source: im, name: cmd, opts: opts}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	if m.Layout, err = model.NewLayout(im.Shape); err != nil {
		return nil, fmt.Errorf("%s: --model %s: %w", cmd, im.Path, err)
	}
	switch opts.DType {
	case "fp32":
		m.DType, m.DTypeWhy, m.dtypeSet = gpu.F32, "--dtype fp32", true
	case "bf16":
		m.DType, m.DTypeWhy, m.dtypeSet = gpu.BF16, "--dtype bf16", true
	default:
		if m.DType, m.DTypeWhy, err = im.ParamDType(); err != nil {
			return nil, fmt.Errorf("%s: %w", cmd, err)
		}
	}
	if m.Tokenizer, m.TokenizerFrom, m.ByteTokenizer, err = im.Tokenizer(); err != nil {
		return nil, err
	}
	m.TokenizerSource = im.TokenizerSource()
	if m.Devices, err = backend.Open(opts.Backend, 1, opts.HBMBytes, true); err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	m.Device = m.Devices.Devs[0]
	return m, nil
}

// Shape is the model's shape.
func (m *Model) Shape() model.Shape { return m.Source.Shape }

// EOS are the ids that end a generation: the tokenizer's EOS and those
// config.json's eos_token_id names (source.Model.EOS), without repeats.
func (m *Model) EOS() []int32 {
	var ids []int32
	if id, ok := m.Tokenizer.EOS(); ok {
		ids = append(ids, id)
	}
	for _, id := range m.Source.EOS() {
		if !contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

func contains(ids []int32, id int32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// CheckFits refuses a model whose parameters and a decoder of opts do
// not fit the device's free memory, saying what each needs.
func (m *Model) CheckFits(opts model.DecoderOptions) error {
	params := m.WeightsBytes()
	dec := model.DecoderBytes(m.Shape(), opts)
	ms := m.Device.MemStats()
	free := ms.BudgetBytes - ms.InUseBytes
	if params+dec <= free {
		return nil
	}
	return fmt.Errorf("%s: the model needs %s on the device: its %s parameters in %s (%s) and %s of activations and key/value cache for %d tokens; %s has %s: "+
		"use a device with more memory (the CPU backend: --hbm), --dtype bf16 or fewer tokens, or (eval) stream the weights through host RAM or NVMe with --offload cpu or --offload nvme --nvme-path DIR",
		m.name, units.FormatBytes(params+dec), FormatCount(m.Layout.ParamCount()), m.DType, units.FormatBytes(params), units.FormatBytes(dec),
		opts.Capacity, m.Device.Name(), units.FormatBytes(free))
}

// Load checks that the parameters and a decoder of opts fit the device
// (CheckFits), uploads the weights a chunk at a time (host memory holds
// one chunk in fp32 and its staging copy) and makes the decoder. A
// cancelled ctx stops it between chunks.
func (m *Model) Load(ctx context.Context, opts model.DecoderOptions) error {
	if m.w != nil {
		return fmt.Errorf("%s: the model is loaded already", m.name)
	}
	if err := m.CheckFits(opts); err != nil {
		return err
	}
	var keep func(c int) bool
	if m.expertsOff() {
		keep = func(c int) bool { return !m.Layout.IsExpert(c) }
	}
	w, err := model.NewWeightsOf(m.Device, m.Layout, m.DType, keep)
	if err != nil {
		return fmt.Errorf("%s: %w", m.name, err)
	}
	m.w = w
	longest := 0
	for _, ch := range m.Layout.Chunks {
		longest = max(longest, ch.Len)
	}
	buf := make([]float32, longest)
	s := m.Device.DefaultStream()
	src := m.Source.Weights()
	for c, ch := range m.Layout.Chunks {
		if err := ctx.Err(); err != nil {
			return err
		}
		if keep != nil && !keep(c) {
			continue
		}
		if err := src.ReadChunk(c, buf[:ch.Len]); err != nil {
			return fmt.Errorf("%s: --model %s: %w", m.name, m.Source.Path, err)
		}
		w.LoadChunk(s, c, buf[:ch.Len])
		if err := s.Synchronize(); err != nil {
			return fmt.Errorf("%s: upload chunk %d: %w", m.name, c, err)
		}
	}
	if keep != nil {
		if m.experts, err = newExpertStore(m, w, m.opts.Experts, m.opts.NVMePath, m.expertSlots(), m.opts.ExpertPolicy); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
	}
	if m.dec, err = model.NewDecoder(m.Device, m.Layout, opts); err != nil {
		return fmt.Errorf("%s: %w", m.name, err)
	}
	m.decOpts = opts
	return nil
}

// Loaded says whether Load has put the weights on the device.
func (m *Model) Loaded() bool { return m.dec != nil }

// WeightsBytes is what the parameters take on the device: all of them,
// or with the experts off the device the others and the expert cache's
// slots (one more than Options.ExpertCache: the scratch a miss is read
// into).
func (m *Model) WeightsBytes() int64 {
	if !m.expertsOff() {
		return model.WeightsBytes(m.Layout, m.DType)
	}
	s := m.Shape()
	experts := int64(m.Layout.ExpertChunks()) * s.ExpertParamCount()
	return (m.Layout.ParamCount() - experts + int64(m.expertSlots()+1)*s.ExpertParamCount()) * int64(m.DType.Size())
}

// expertsOff says whether a mixture of experts keeps its experts off the
// device (Options.Experts).
func (m *Model) expertsOff() bool {
	return m.Shape().MoE() && (m.opts.Experts == ExpertsHost || m.opts.Experts == ExpertsNVMe)
}

// expertSlots is the expert cache's size, at most every expert.
func (m *Model) expertSlots() int { return min(m.opts.ExpertCache, m.Layout.ExpertChunks()) }

// ExpertStats is the expert store's counters since Load (zero when the
// experts are on the device).
func (m *Model) ExpertStats() ExpertStats {
	if m.experts == nil {
		return ExpertStats{}
	}
	return m.experts.Stats()
}

// params is what the decoder reads the weights through.
func (m *Model) params() model.Params {
	if m.experts != nil {
		return m.experts
	}
	return m.w
}

// Close frees the device memory and closes the backend and the files.
func (m *Model) Close() error {
	if m.Device != nil {
		m.Device.DefaultStream().Synchronize()
	}
	if m.dec != nil {
		m.dec.Free()
		m.dec = nil
	}
	if m.experts != nil {
		m.experts.close()
		m.experts = nil
	}
	if m.w != nil {
		m.w.Free()
		m.w = nil
	}
	var errs []error
	if m.Devices != nil {
		errs = append(errs, m.Devices.Close())
		m.Devices = nil
	}
	errs = append(errs, m.Source.Close())
	return errors.Join(errs...)
}

// FormatCount prints a parameter count: 124.4M, 8.03B.
func FormatCount(n int64) string {
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
