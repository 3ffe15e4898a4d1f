package checkpoint

import (
	"context"

	"fmt"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/tokenizer"
)

// Export as one call: `strata export` is Export with the options its flags
// give, and prints the ExportResult.

// ExportFormat is what Export writes.
type ExportFormat string

// Export formats.
const (
	// FormatSafetensors is one safetensors file of the weights
	// (ExportCheckpoint).
	FormatSafetensors ExportFormat = "safetensors"
	// FormatHF is a Hugging Face model directory (ExportHF); a LoRA run's
	// with ExportOptions.Merge.
	FormatHF ExportFormat = "hf"
	// FormatPEFT is a LoRA run's adapters as a PEFT adapter directory
	// (ExportPEFT).
	FormatPEFT ExportFormat = "peft"
)

// ExportOptions control Export.
type ExportOptions struct {
	Format ExportFormat // FormatSafetensors (default), FormatHF or FormatPEFT
	// Merge (FormatHF, and only of a LoRA run) writes the merged model:
	// every adapted weight W + scaling·B·A.
	Merge bool
	// Names (FormatSafetensors) are the tensor names: hf.NamesStrata
	// (default) or hf.NamesHF.
	Names hf.Naming
	// DType is the stored dtype, F32 or BF16 (rounded to nearest even).
	// 0 is F32, except for a merged export of a run that started from a
	// Hugging Face directory: each tensor then keeps the dtype of its base
	// there, as PEFT's merge does (ExportHF).
	DType dtype.DType
	// MaxShardBytes (FormatHF) bounds each weight file's tensor bytes;
	// 0 is hf.DefaultMaxShardBytes.
	MaxShardBytes int64
}

// OptionError is an export option the checkpoint does not admit (Merge
// of a run without adapters, a LoRA run to FormatHF without Merge): the
// caller's choice to change, not a failure of the files.
type OptionError struct{ Msg string }

func (e *OptionError) Error() string { return e.Msg }

// Validate says what is wrong with the options themselves, before any
// checkpoint is read.
func (o ExportOptions) Validate() error {
	bad := func(format string, args ...any) error { return &OptionError{fmt.Sprintf(format, args...)} }
	switch o.Format {
	case "", FormatSafetensors, FormatHF, FormatPEFT:
	default:
		return bad("export: --format %q (want safetensors, hf or peft)", o.Format)
	}
	switch {
	case o.DType != 0 && o.DType != dtype.F32 && o.DType != dtype.BF16:
		return bad("export: --dtype %s (want fp32 or bf16)", o.DType)
	case o.Format != FormatHF && o.Merge:
		return bad("export: --merge is for --format hf (the merged model of a LoRA run)")
	case o.Format == FormatHF && o.Names != hf.NamesAuto:
		return bad("export: --names is for --format safetensors; --format hf writes transformers' names")
	case o.Format != FormatHF && o.MaxShardBytes != 0:
		return bad("export: --max-shard-size is for --format hf")
	case o.MaxShardBytes < 0:
		return bad("export: max shard size %d bytes must be positive", o.MaxShardBytes)
	}
	if o.Names != hf.NamesAuto && o.Names != hf.NamesStrata && o.Names != hf.NamesHF {
		return bad("export: --names %q (want strata or hf)", o.Names)
	}
	return nil
}

// ExportResult is what Export wrote.
type ExportResult struct {
	Format ExportFormat `json:"format"`
	Path   string       `json:"path"` // dst
	Step   int64        `json:"step"` // the checkpoint's
	Params int64        `json:"params"`
	// DType is the stored dtype ("f32", "bf16"; of a merged export that
	// keeps its base's dtypes, the dtype of most parameters).
	DType string    `json:"dtype"`
	Names hf.Naming `json:"names,omitempty"` // FormatSafetensors
	// Files are the files written: the weight files of FormatHF, PEFT's
	// two files, the one file of FormatSafetensors.
	Files []string `json:"files"`
	// SizeBytes is the file's size (FormatSafetensors) or the tensors'
	// bytes (FormatHF: the index's total_size).
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// Tokenizer are the tokenizer files copied from the run's source
	// (FormatHF).
	Tokenizer []string `json:"tokenizer,omitempty"`
	// Written are the prompting files written for the run (FormatHF:
	// hf.DirExport.Written).
	Written []string `json:"written,omitempty"`
	// ChatTemplate is where the run's chat template came from
	// (data.ChatTemplate.Source); "" when it recorded none.
	ChatTemplate string `json:"chat_template,omitempty"`
	// LoRA is the run's LoRA (FormatPEFT); nil otherwise.
	LoRA *model.LoRA `json:"lora,omitempty"`
	// Notes are what a reader should know: stale temporaries of a
	// killed export removed, what of the source could not be used.
	Notes []string `json:"notes,omitempty"`
}

// Export writes the weights of the training checkpoint at src (a
// checkpoint directory, or a directory whose "latest" names one) to dst as
// opts.Format says: one safetensors file (ExportCheckpoint; a temporary
// file a killed export to dst left is removed first), a Hugging Face
// directory (ExportHF, with generation_config.json's token ids from the
// run's tokenizer and chat template), or a LoRA run's adapters as a PEFT
// directory (ExportPEFT). Every rank file's checksum is verified first,
// then the weights stream one chunk at a time; ctx is checked between
// chunks. An option the checkpoint does not admit is an *OptionError. The
// result is returned with an error too, for its Notes.
func Export(ctx context.Context, src, dst string, opts ExportOptions) (*ExportResult, error) {
	res := &ExportResult{Format: opts.Format, Path: dst, Names: opts.Names}
	if res.Format == "" {
		res.Format = FormatSafetensors
	}
	if err := opts.Validate(); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	dt := opts.DType
	if dt == 0 {
		dt = dtype.F32
	}
	res.DType = dt.String()
	switch res.Format {
	case FormatHF:
		return res, exportHF(ctx, src, dst, opts, res)
	case FormatPEFT:
		files, notes, st, err := ExportPEFT(ctx, dst, src, dt)
		res.Notes, res.Files = notes, files
		if err != nil {
			return res, err
		}
		res.Step, res.Params, res.LoRA = st.Step, st.ParamCount(), st.LoRA
		return res, nil
	}
	eo := hf.ExportOptions{DType: dt, Names: opts.Names}
	if eo.Names == hf.NamesAuto {
		eo.Names = hf.NamesStrata
	}
	res.Names = eo.Names
	// A killed export to dst left .DST.tmp-PID-*: removed when provably dead.
	stale, err := durable.RemoveStale(filepath.Dir(filepath.Clean(dst)), filepath.Base(filepath.Clean(dst)))
	res.Notes = stale
	if err != nil {
		return res, fmt.Errorf("export: %w", err)
	}
	st, err := ExportCheckpoint(ctx, dst, src, eo)
	if err != nil {
		return res, err
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return res, err
	}
	res.Step, res.Params, res.Files, res.SizeBytes = st.Step, st.ParamCount(), []string{filepath.Base(dst)}, fi.Size()
	return res, nil
}

// exportHF is Export's FormatHF.
func exportHF(ctx context.Context, src, dst string, opts ExportOptions, res *ExportResult) error {
	m, _, err := ReadManifest(src)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	switch {
	case m.LoRA != nil && !opts.Merge:
		return &OptionError{fmt.Sprintf("export: %s trained LoRA adapters (strata.lora): --format hf --merge writes the merged model, --format peft the adapters", src)}
	case m.LoRA == nil && opts.Merge:
		return &OptionError{fmt.Sprintf("export: --merge: %s has no LoRA adapters to merge (it trained every weight)", src)}
	}
	gen, err := generationIDs(m.Source, m.ChatTemplate)
	if err != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("generation_config.json has only config.json's token ids: %v", err))
	}
	out, st, err := ExportHF(ctx, dst, src, hf.DirOptions{DType: opts.DType, MaxShardBytes: opts.MaxShardBytes, Generation: gen})
	if err != nil {
		return err
	}
	res.Notes = append(res.Notes, out.Notes...)
	res.Step, res.Params, res.DType = st.Step, st.ParamCount(), out.DType.String()
	res.Files, res.SizeBytes, res.Tokenizer, res.Written = out.Files, out.TotalBytes, out.Tokenizer, out.Written
	if m.ChatTemplate != nil {
		res.ChatTemplate = m.ChatTemplate.Source()
	}
	return nil
}

// generationIDs are the token ids generation_config.json takes from the
// run's tokenizer (the tokenizer.json of source): its BOS and EOS, the
// pad token of its tokenizer_config.json, and the end of turn of the
// run's chat template when that is one token of it. None for a run
// without a tokenizer.json (the byte vocabulary has no special tokens);
// the ids found before an error with it.
func generationIDs(source *hf.Source, chat *data.ChatTemplate) (hf.GenerationIDs, error) {
	var ids hf.GenerationIDs
	p := source.TokenizerPath()
	if p == "" {
		return ids, nil
	}
	tok, err := tokenizer.Load(p)
	if err != nil {
		return ids, err
	}
	if id, ok := tok.BOS(); ok {
		ids.BOS = &id
	}
	if id, ok := tok.EOS(); ok {
		ids.EOS = &id
	}
	if tmpl, err := data.LoadChatTemplate(source.Path); err == nil {
		if pad, ok := tmpl.SpecialTokens()["pad_token"]; ok {
			if id, ok := tok.TokenID(pad); ok {
				ids.Pad = &id
			}
		}
	}
	if chat != nil {
		eot, err := chat.EndOfTurn()
		if err != nil {
			return ids, err
		}
		if id, ok := tok.TokenID(eot); ok {
			ids.EndOfTurn = &id
		}
	}
	return ids, nil
}

// ctxErr is ctx's error, named as an export's.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("checkpoint: export: %w", err)
	}
	return nil
}
