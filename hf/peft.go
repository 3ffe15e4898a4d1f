package hf

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// PEFT LoRA adapters, as peft's save_pretrained writes a LoraModel's:
// adapter_config.json (LoraConfig's keys) and adapter_model.safetensors,
// each adapted module's "base_model.model.<module>.lora_A.weight" (r×in)
// and "...lora_B.weight" (out×r) under transformers' module paths
// ("model.layers.0.self_attn.q_proj", GPT-2's
// "transformer.h.0.attn.c_attn"; GPT-2's Conv1D modules are adapted with
// fan_in_fan_out, their A and B stored as for nn.Linear all the same).

// PEFTConfigFile and PEFTWeightsFile are a PEFT adapter directory's files.
const (
	PEFTConfigFile  = "adapter_config.json"
	PEFTWeightsFile = "adapter_model.safetensors"
)

// peftConfig is the part of adapter_config.json Strata writes and reads.
type peftConfig struct {
	PEFTType       string   `json:"peft_type"`
	TaskType       string   `json:"task_type"`
	BaseModel      string   `json:"base_model_name_or_path"`
	R              *int     `json:"r"`          // PEFT's default 8 when absent
	Alpha          *float64 `json:"lora_alpha"` // PEFT's default 8 when absent
	Dropout        float64  `json:"lora_dropout"`
	TargetModules  any      `json:"target_modules"`            // a list, or a string (a regular expression, or "all-linear")
	ExcludeModules any      `json:"exclude_modules,omitempty"` // a list of names or path ends, or a regular expression
	UseRSLoRA      bool     `json:"use_rslora"`
	Bias           string   `json:"bias"`
	FanInFanOut    bool     `json:"fan_in_fan_out"`
	InferenceMode  bool     `json:"inference_mode"`
	InitLoRA       bool     `json:"init_lora_weights"`
	UseDoRA        bool     `json:"use_dora"`
	ModulesToSave  []string `json:"modules_to_save"`
	LayersToTrans  any      `json:"layers_to_transform"`
	RankPattern    any      `json:"rank_pattern,omitempty"`
	AlphaPattern   any      `json:"alpha_pattern,omitempty"`
	LoftQConfig    any      `json:"loftq_config,omitempty"`
	MegatronConfig any      `json:"megatron_config,omitempty"`
}

// peftName is the PEFT key of an adapter tensor of layout l.
func peftName(l *model.Layout, t model.Tensor) string {
	return "base_model.model." + hfPrefixed(l.Shape, t.Name)
}

// ExportPEFT writes l's LoRA adapters as a PEFT adapter directory at dir
// (new or empty): adapter_model.safetensors in dt (F32 or BF16, rounded to
// nearest even), read a chunk at a time through read (chunk index, fp32
// values), and adapter_config.json naming base (the base model's path or
// hub id; may be empty). It returns the files written and notes (stale
// temporaries of a killed export removed). The adapters are held in host
// memory together (r·(in+out) per module and block: a small part of the
// model). As ExportDir, it writes a temporary directory beside dir, each
// file fsynced, and renames it to dir: a failure (a full disk) leaves no
// dir, and the same export can be tried again.
func ExportPEFT(dir string, l *model.Layout, base string, dt dtype.DType, read func(c int, dst []float32) error) (files, notes []string, err error) {
	o := l.LoRA
	if o == nil {
		return nil, nil, fmt.Errorf("hf: peft export: layout %q has no LoRA adapters (the run has no strata.lora)", l.Name)
	}
	if dt != dtype.F32 && dt != dtype.BF16 {
		return nil, nil, fmt.Errorf("hf: peft export: dtype %s (want fp32 or bf16)", dt)
	}
	if err := checkOutDir(dir); err != nil {
		return nil, nil, err
	}
	var tensors []safetensors.Tensor
	for c, ch := range l.Chunks {
		if !l.IsAdapter(c) {
			continue
		}
		v := make([]float32, ch.Len)
		if err := read(c, v); err != nil {
			return nil, nil, fmt.Errorf("hf: peft export: chunk %d (%s): %w", c, ch.Name, err)
		}
		for _, t := range ch.Tensors {
			ft := fileTensor{chunk: c, t: t, shape: t.Shape}
			data := make([]byte, t.Len*dt.Size())
			encodeTensor(data, dt, chunkOf(v), ft)
			tensors = append(tensors, safetensors.Tensor{Name: peftName(l, t), DType: dt, Shape: slices.Clone(t.Shape), Data: data})
		}
	}
	var targets any = o.Targets
	if len(o.Targets) == 1 && o.Targets[0] == "all-linear" {
		targets = "all-linear"
	}
	cfg := peftConfig{PEFTType: "LORA", TaskType: "CAUSAL_LM", BaseModel: base, R: &o.R, Alpha: &o.Alpha, Dropout: o.Dropout,
		TargetModules: targets, UseRSLoRA: o.RSLoRA, Bias: "none", FanInFanOut: !l.Shape.IsLlama(), InferenceMode: true, InitLoRA: true}
	js, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(dir)), 0o755); err != nil {
		return nil, nil, fmt.Errorf("hf: peft export: %w", err)
	}
	notes, err = writeDirAtomic(dir, func(tmp string) error {
		if err := safetensors.WriteFile(filepath.Join(tmp, PEFTWeightsFile), tensors, map[string]string{"format": "pt"}); err != nil {
			return err
		}
		return durable.Create(filepath.Join(tmp, PEFTConfigFile), append(js, '\n'))
	})
	if err != nil {
		return nil, notes, fmt.Errorf("hf: peft export %s: %w", dir, err)
	}
	return []string{PEFTWeightsFile, PEFTConfigFile}, notes, nil
}

// PEFTAdapter is a PEFT LoRA adapter directory opened for a base shape:
// its LoRA (for model.Layout.WithLoRA) and its tensors, which ReadChunk
// hands out as the adapter chunks of that layout.
type PEFTAdapter struct {
	Dir  string
	LoRA model.LoRA
	// BaseModel is adapter_config.json's base_model_name_or_path: the
	// path or hub id of the model the adapter was trained on ("" when it
	// names none).
	BaseModel string
	layout    *model.Layout
	file      *safetensors.File
}

// OpenPEFT opens the PEFT adapter at dir for a base model of shape s. It
// reads adapter_config.json as PEFT's LoraConfig does (r and lora_alpha
// default to 8; exclude_modules, a list or a regular expression, takes
// modules out of target_modules), and refuses what Strata does not build
// (another peft_type, DoRA, biases, modules_to_save, per-layer ranks or
// targets, an exclusion of some blocks' modules only), a target that
// matches no linear of s, tensors missing or of another shape than s
// gives them, and a NaN or infinite value, each naming the key.
func OpenPEFT(dir string, s model.Shape) (*PEFTAdapter, error) {
	js, err := os.ReadFile(filepath.Join(dir, PEFTConfigFile))
	if err != nil {
		return nil, fmt.Errorf("hf: peft adapter %s: %w", dir, err)
	}
	var cfg peftConfig
	if err := json.Unmarshal(js, &cfg); err != nil {
		return nil, fmt.Errorf("hf: peft adapter %s: %s: %w", dir, PEFTConfigFile, err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("hf: peft adapter %s: %s: %s", dir, PEFTConfigFile, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.PEFTType != "LORA":
		return nil, bad("peft_type %q: only LORA adapters are built", cfg.PEFTType)
	case cfg.UseDoRA:
		return nil, bad("use_dora true: DoRA is not built")
	case cfg.Bias != "" && cfg.Bias != "none":
		return nil, bad("bias %q: only \"none\" is built", cfg.Bias)
	case len(cfg.ModulesToSave) > 0:
		return nil, bad("modules_to_save %v: training whole modules beside the adapters is not built", cfg.ModulesToSave)
	case cfg.LayersToTrans != nil:
		return nil, bad("layers_to_transform: adapters of some layers only are not built")
	case nonEmpty(cfg.RankPattern) || nonEmpty(cfg.AlphaPattern):
		return nil, bad("rank_pattern or alpha_pattern: per-module ranks are not built")
	case cfg.LoftQConfig != nil && nonEmpty(cfg.LoftQConfig):
		return nil, bad("loftq_config: LoftQ initialisation is not built")
	}
	// PEFT's LoraConfig defaults: r 8, lora_alpha 8.
	o := model.LoRA{R: 8, Alpha: 8, Dropout: cfg.Dropout, RSLoRA: cfg.UseRSLoRA}
	if cfg.R != nil {
		o.R = *cfg.R
	}
	if cfg.Alpha != nil {
		o.Alpha = *cfg.Alpha
	}
	switch t := cfg.TargetModules.(type) {
	case string:
		if t != "all-linear" {
			return nil, bad("target_modules %q: a regular expression is not built; list the module names", t)
		}
		o.Targets = []string{t}
	case []any:
		for _, x := range t {
			name, ok := x.(string)
			if !ok {
				return nil, bad("target_modules: %v is not a module name", x)
			}
			o.Targets = append(o.Targets, name)
		}
	default:
		return nil, bad("target_modules %v: want a list of module names", cfg.TargetModules)
	}
	base, err := model.NewLayout(s)
	if err != nil {
		return nil, err
	}
	l, err := base.WithLoRA(o)
	if err != nil {
		return nil, fmt.Errorf("hf: peft adapter %s: %w", dir, err)
	}
	if cfg.ExcludeModules != nil {
		targets, err := excludeModules(l, cfg.ExcludeModules)
		if err != nil {
			return nil, bad("%v", err)
		}
		if targets != nil {
			o.Targets = targets
			if l, err = base.WithLoRA(o); err != nil {
				return nil, fmt.Errorf("hf: peft adapter %s: %w", dir, err)
			}
		}
	}
	f, err := safetensors.Open(filepath.Join(dir, PEFTWeightsFile))
	if err != nil {
		return nil, fmt.Errorf("hf: peft adapter %s: %w", dir, err)
	}
	want := map[string]bool{}
	for c, ch := range l.Chunks {
		if !l.IsAdapter(c) {
			continue
		}
		for _, t := range ch.Tensors {
			name := peftName(l, t)
			want[name] = true
			ti, ok := f.Header.Tensor(name)
			if !ok {
				f.Close()
				return nil, fmt.Errorf("hf: peft adapter %s: %s has no %s (is it an adapter of another model, or of other target_modules?)", dir, PEFTWeightsFile, name)
			}
			if _, ok := importDTypes[ti.DType]; !ok {
				f.Close()
				return nil, fmt.Errorf("hf: peft adapter %s: %s has dtype %s (import reads F32, BF16 or F16)", dir, name, ti.DType)
			}
			if !ti.HasShape(t.Shape) {
				f.Close()
				return nil, fmt.Errorf("hf: peft adapter %s: %s is %v, the base model (%s) needs %v: an adapter of another base shape", dir, name, ti.Shape, s, t.Shape)
			}
		}
	}
	var extra []string
	for _, ti := range f.Header.Tensors {
		if !want[ti.Name] {
			extra = append(extra, ti.Name)
		}
	}
	if len(extra) > 0 {
		f.Close()
		return nil, fmt.Errorf("hf: peft adapter %s: %s holds tensors no module of the config gives: %s", dir, PEFTWeightsFile, listSome(extra))
	}
	p := &PEFTAdapter{Dir: dir, LoRA: o, BaseModel: cfg.BaseModel, layout: l, file: f}
	// Every value is read once here, so that a NaN or an infinity is
	// refused now, naming its tensor, rather than as a loss at step 1.
	var buf []float32
	for c := range l.Chunks {
		if !l.IsAdapter(c) {
			continue
		}
		buf = slices.Grow(buf[:0], l.Chunks[c].Len)[:l.Chunks[c].Len]
		if err := p.ReadChunk(c, buf); err != nil {
			f.Close()
			return nil, err
		}
	}
	return p, nil
}

// excludeModules applies PEFT's exclude_modules (a list: a module whose
// name is one of them or ends in "." and one of them; a string: a regular
// expression the whole name matches) to the adapted modules of l, named
// as in the base model ("model.layers.0.self_attn.q_proj"). It returns
// the targets that remain, as paths within a block
// ("self_attn.q_proj"), or nil when nothing is excluded. A module
// excluded in some blocks but not others is refused (adapters of some
// layers only are not built), as is an exclusion of every module.
func excludeModules(l *model.Layout, ex any) ([]string, error) {
	var excluded func(key string) bool
	switch x := ex.(type) {
	case string:
		re, err := regexp.Compile(`^(?:` + x + `)$`)
		if err != nil {
			return nil, fmt.Errorf("exclude_modules %q: not a regular expression Go reads (RE2: no lookaround or backreferences): %v", x, err)
		}
		excluded = re.MatchString
	case []any:
		var names []string
		for _, v := range x {
			name, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("exclude_modules: %v is not a module name", v)
			}
			names = append(names, name)
		}
		excluded = func(key string) bool {
			for _, n := range names {
				if key == n || strings.HasSuffix(key, "."+n) {
					return true
				}
			}
			return false
		}
	default:
		return nil, fmt.Errorf("exclude_modules %v: want a list of module names or a regular expression", ex)
	}
	// path within the block -> the layers that exclude it, and its order
	var paths []string
	out := map[string][]int{}
	for layer := range l.Shape.Layers {
		prefix := blockPrefixOf(l.Shape, layer)
		for _, t := range l.Chunks[l.AdapterChunk(layer)].Tensors {
			module, ok := strings.CutSuffix(t.Name, ".lora_A.weight")
			if !ok {
				continue
			}
			path := strings.TrimPrefix(module, prefix)
			if layer == 0 {
				paths = append(paths, path)
			}
			if excluded(hfPrefixed(l.Shape, module)) {
				out[path] = append(out[path], layer)
			}
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	var keep []string
	for _, path := range paths {
		switch n := len(out[path]); {
		case n == 0:
			keep = append(keep, path)
		case n < l.Shape.Layers:
			return nil, fmt.Errorf("exclude_modules %v excludes %s in blocks %v only: adapters of some layers only are not built", ex, path, out[path])
		}
	}
	if len(keep) == 0 {
		return nil, fmt.Errorf("exclude_modules %v excludes every module target_modules adapts (%s): nothing to adapt", ex, strings.Join(paths, ", "))
	}
	return keep, nil
}

// blockPrefixOf is the prefix of block layer's tensor names in the
// layout of s ("layers.0.", GPT-2's "h.0.").
func blockPrefixOf(s model.Shape, layer int) string {
	if s.IsLlama() {
		return fmt.Sprintf("layers.%d.", layer)
	}
	return fmt.Sprintf("h.%d.", layer)
}

func nonEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case map[string]any:
		return len(x) > 0
	case []any:
		return len(x) > 0
	}
	return true
}

// ReadChunk fills dst with adapter chunk c of the adapter's layout (the
// base shape's, WithLoRA of the adapter's LoRA) as fp32.
func (p *PEFTAdapter) ReadChunk(c int, dst []float32) error {
	if !p.layout.IsAdapter(c) || len(dst) != p.layout.Chunks[c].Len {
		return fmt.Errorf("hf: peft adapter %s: chunk %d is not one of its adapter chunks", p.Dir, c)
	}
	for _, t := range p.layout.Chunks[c].Tensors {
		ti, _ := p.file.Header.Tensor(peftName(p.layout, t))
		raw := make([]byte, ti.SizeBytes())
		if err := p.file.ReadTensor(ti, raw); err != nil {
			return fmt.Errorf("hf: peft adapter %s: %w", p.Dir, err)
		}
		if _, ok := importDTypes[ti.DType]; !ok {
			return fmt.Errorf("hf: peft adapter %s: %s has dtype %s (import reads F32, BF16 or F16)", p.Dir, ti.Name, ti.DType)
		}
		v := dst[t.Offset : t.Offset+t.Len]
		widen(v, raw, ti.DType)
		for i, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("hf: peft adapter %s: %s: %s holds %v at element %d: the adapter is broken (a diverged or corrupted run); it cannot be trained on", p.Dir, PEFTWeightsFile, ti.Name, x, i)
			}
		}
	}
	return nil
}

// Shape is the base shape the adapter was opened for.
func (p *PEFTAdapter) Shape() model.Shape { return p.layout.Shape }

// Close closes the adapter's weights file.
func (p *PEFTAdapter) Close() error { return p.file.Close() }
