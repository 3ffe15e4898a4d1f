package hf

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// DefaultMaxShardBytes bounds the tensor bytes of each weight file of an
// exported Hugging Face directory: transformers' save_pretrained default,
// "5GB" (decimal).
const DefaultMaxShardBytes = 5_000_000_000

// ParseShardSize reads a shard size as transformers' max_shard_size does:
// decimal suffixes KB, MB, GB, TB (10^3 ...), binary KiB, MiB, GiB, TiB
// (2^10 ...), or a number of bytes.
func ParseShardSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || !(f > 0) || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("hf: shard size %q: want a positive size such as 5GB (10^9 B), 2GiB (2^30 B) or 1000000", s)
	}
	return int64(f * float64(mult)), nil
}

// DirOptions control ExportDir.
type DirOptions struct {
	DType dtype.DType // F32 (default) or BF16 (round to nearest even)
	// MaxShardBytes bounds each weight file's tensor bytes (0:
	// DefaultMaxShardBytes); a tensor larger than it gets a file of its
	// own, as in transformers.
	MaxShardBytes int64
	// Source, when it is a Hugging Face directory (Format SourceHF),
	// gives config.json its other keys (ConfigJSON's base) and the
	// tokenizer files to copy (Source.Tokenizer).
	Source *Source
	// ChatTemplate, when set, is written as chat_template.jinja and
	// tokenizer_config.json's chat_template: the template the run
	// trained with, which transformers' apply_chat_template then renders.
	ChatTemplate *data.ChatTemplate
	// Generation gives generation_config.json the token ids config.json
	// lacks (a source's own generation_config.json is copied instead).
	Generation GenerationIDs
	// KeepDTypes, when set, is the model whose dtypes the export keeps
	// (a LoRA run merged into its base, as PEFT's merge keeps the base's):
	// each tensor is written in the dtype its file there stores it in
	// (F32, BF16 or F16), and config.json's torch_dtype is the dtype of
	// most of its parameters; DType is then unused. Its shape must be the
	// layout's.
	KeepDTypes *Model
}

func (o *DirOptions) defaults() {
	if o.DType == 0 {
		o.DType = dtype.F32
	}
	if o.MaxShardBytes == 0 {
		o.MaxShardBytes = DefaultMaxShardBytes
	}
}

// Validate says what is wrong with the options (after defaults).
func (o DirOptions) Validate() error {
	o.defaults()
	if o.DType != dtype.F32 && o.DType != dtype.BF16 {
		return fmt.Errorf("hf: export dtype %v (want f32 or bf16)", o.DType)
	}
	if o.MaxShardBytes < 1 {
		return fmt.Errorf("hf: export max shard size %d bytes must be positive", o.MaxShardBytes)
	}
	return nil
}

// DirExport is what ExportDir wrote.
type DirExport struct {
	Dir        string
	Files      []string // the weight files, in order
	TotalBytes int64    // the tensors' bytes (the index's total_size)
	Tokenizer  []string // files copied from the source
	// Written are the prompting files written for the run rather than
	// copied: chat_template.jinja and tokenizer_config.json (with a chat
	// template), generation_config.json (without the source's).
	Written []string
	Notes   []string // what of the source could not be used; stale temporaries removed
	// DType is config.json's torch_dtype: DirOptions.DType, or the
	// dtype of most parameters of DirOptions.KeepDTypes.
	DType dtype.DType
}

// hfShard is one weight file: tensors fts[first:end].
type hfShard struct {
	name       string
	first, end int
	bytes      int64
}

// planShards splits the tensors, in order, into files of at most max
// tensor bytes (one larger tensor alone), named as transformers names
// them: model.safetensors when one file suffices, else
// model-0000N-of-0000M.safetensors.
func planShards(sizes []int64, maxBytes int64) []hfShard {
	var out []hfShard
	for i, n := range sizes {
		if len(out) == 0 || out[len(out)-1].bytes+n > maxBytes && out[len(out)-1].end > out[len(out)-1].first {
			out = append(out, hfShard{first: i, end: i})
		}
		s := &out[len(out)-1]
		s.end, s.bytes = i+1, s.bytes+n
	}
	for i := range out {
		out[i].name = WeightsName
		if len(out) > 1 {
			out[i].name = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(out))
		}
	}
	return out
}

// ExportDir writes a Hugging Face model directory at dir (which must not
// exist or be empty): config.json (ConfigJSON, torch_dtype from
// opts.DType), the weights in files of at most opts.MaxShardBytes with
// model.safetensors.index.json when there are several, each tensor under
// the name transformers gives it ("model." or "transformer." before the
// layout's Hugging Face name, GPT-2's Conv1D weights transposed to
// in×out; a tied head is not written), metadata {"format": "pt"}; and the
// tokenizer files of opts.Source. produce hands the chunks over as for
// ExportStream, so the weights stream one chunk at a time: host memory is
// ExportStream's (one tensor in the file's dtype and a 1 MiB write buffer)
// besides what produce holds. Everything is written into a temporary
// directory beside dir, each file fsynced, then renamed to dir: a failure
// leaves no dir. The temporary directory is .DIR.tmp-PID-*, flocked while
// it is written; one that a killed export left is removed (a Note says so).
func ExportDir(dir string, layout *model.Layout, opts DirOptions, produce func(w *ExportWriter) error) (*DirExport, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.defaults()
	if layout.Custom() {
		return nil, fmt.Errorf("hf: export %s: %q is a custom model, which a Hugging Face config.json cannot describe; export its weights as one safetensors file under its own tensor names (checkpoint.ExportCheckpoint, strata export --format safetensors)", dir, layout.Name)
	}
	if err := checkOutDir(dir); err != nil {
		return nil, err
	}
	fts := fileTensors(layout, NamesHF)
	out := &DirExport{Dir: dir, DType: opts.DType}
	if k := opts.KeepDTypes; k != nil {
		dt, err := keepDTypes(fts, layout, k)
		if err != nil {
			return nil, err
		}
		out.DType = dt
	}
	var base []byte
	if src := opts.Source; src != nil && src.Format == SourceHF {
		b, err := os.ReadFile(filepath.Join(src.Path, ConfigName))
		if err != nil {
			out.Notes = append(out.Notes, fmt.Sprintf("config.json written from the shape alone: the source's could not be read (%v)", err))
		}
		base = b
	}
	cfg, err := ConfigJSON(layout.Shape, out.DType, base)
	if err != nil {
		return nil, err
	}
	pre := len(out.Notes) // the notes of the source, before those of stale temporaries
	notes, err := writeDirAtomic(dir, func(tmp string) error {
		if err := durable.Create(filepath.Join(tmp, ConfigName), cfg); err != nil {
			return err
		}
		sizes := make([]int64, len(fts))
		for i := range fts {
			fts[i].name = hfPrefixed(layout.Shape, fts[i].name)
			sizes[i] = int64(fts[i].t.Len * fts[i].dtypeOr(opts.DType).Size())
			out.TotalBytes += sizes[i]
		}
		shards := planShards(sizes, opts.MaxShardBytes)
		if err := writeHFShards(tmp, layout, fts, shards, opts.DType, produce); err != nil {
			return err
		}
		weightMap := map[string]string{}
		for _, s := range shards {
			out.Files = append(out.Files, s.name)
			for _, ft := range fts[s.first:s.end] {
				weightMap[ft.name] = s.name
			}
		}
		if len(shards) > 1 {
			index := map[string]any{"metadata": map[string]any{"total_size": out.TotalBytes}, "weight_map": weightMap}
			b, _ := json.MarshalIndent(index, "", "  ")
			if err := durable.Create(filepath.Join(tmp, IndexName), append(b, '\n')); err != nil {
				return err
			}
		}
		if src := opts.Source; src != nil && src.Format == SourceHF {
			for _, name := range src.Tokenizer {
				if err := durable.Copy(filepath.Join(tmp, name), filepath.Join(src.Path, name)); err != nil {
					out.Notes = append(out.Notes, fmt.Sprintf("tokenizer file not copied: %v", err))
					continue
				}
				out.Tokenizer = append(out.Tokenizer, name)
			}
		}
		return writePrompting(tmp, cfg, opts, out)
	})
	out.Notes = slices.Concat(out.Notes[:pre], notes, out.Notes[pre:])
	if err != nil {
		return nil, fmt.Errorf("hf: export %s: %w", dir, err)
	}
	return out, nil
}

// keepDTypes sets the dtype of each of fts (a layout's, under Hugging
// Face names) to its dtype in k's files, and returns the dtype of most
// parameters (of the first of equals, in the order F32, BF16, F16).
func keepDTypes(fts []fileTensor, layout *model.Layout, k *Model) (dtype.DType, error) {
	if withoutName(k.Layout.Shape).Canonical() != withoutName(layout.Shape).Canonical() {
		return 0, fmt.Errorf("hf: export: the model whose dtypes are kept (%s) is %s, the export's layout %s", k.Dir, k.Layout.Shape, layout.Shape)
	}
	of := map[string]string{}
	for _, ps := range k.w.chunks {
		for _, p := range ps {
			of[p.name] = p.info.DType
		}
	}
	elems := map[dtype.DType]int{}
	for i := range fts {
		name, ok := of[fts[i].name]
		if !ok {
			return 0, fmt.Errorf("hf: export: %s has no tensor %s to take its dtype from", k.Dir, fts[i].name)
		}
		dt, ok := safetensors.ParseDTypeName(name)
		if !ok || !(dt == dtype.F32 || dt.Half()) {
			return 0, fmt.Errorf("hf: export: %s: %s has dtype %s (kept: F32, BF16 or F16)", k.Dir, fts[i].name, name)
		}
		fts[i].dt = dt
		elems[dt] += fts[i].t.Len
	}
	most := dtype.F32
	for _, dt := range []dtype.DType{dtype.BF16, dtype.F16} {
		if elems[dt] > elems[most] {
			most = dt
		}
	}
	return most, nil
}

// dtypeOr is ft's own dtype, else dt.
func (ft fileTensor) dtypeOr(dt dtype.DType) dtype.DType {
	if ft.dt != 0 {
		return ft.dt
	}
	return dt
}

// writeDirAtomic writes the directory dir (absent, or empty: checkOutDir)
// as fill writes the temporary directory it is given: .DIR.tmp-PID-*
// beside dir, flocked while it is written, each file fsynced by fill, the
// directory fsynced, then renamed to dir and the parent fsynced. A failure
// anywhere removes the temporary directory and leaves dir as it was. A
// temporary directory that a killed writer left (its pid gone, its lock
// free) is removed first, with a note; a live writer's is left alone.
func writeDirAtomic(dir string, fill func(tmp string) error) (notes []string, err error) {
	parent, name := filepath.Dir(filepath.Clean(dir)), filepath.Base(filepath.Clean(dir))
	notes, err = durable.RemoveStale(parent, name)
	if err != nil {
		return notes, err
	}
	tmp, err := os.MkdirTemp(parent, durable.TempPattern(name))
	if err != nil {
		return notes, err
	}
	lock, err := os.Open(tmp)
	if err == nil {
		defer lock.Close() // the lock goes with it, after the rename
		err = durable.LockTemp(lock)
	}
	if err == nil {
		err = fill(tmp)
	}
	if err == nil {
		err = os.Chmod(tmp, 0o755) // MkdirTemp's 0700, as a directory made by mkdir
	}
	if err == nil {
		err = durable.SyncDir(tmp)
	}
	if err == nil {
		os.Remove(dir) // empty, or absent (checkOutDir)
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return notes, err
	}
	return notes, durable.SyncDir(parent)
}

// writePrompting writes the run's chat template (opts.ChatTemplate) and,
// unless the source's was copied, generation_config.json, listing them in
// out.Written.
func writePrompting(dir string, cfg []byte, opts DirOptions, out *DirExport) error {
	if opts.ChatTemplate != nil {
		if err := writeChatTemplate(dir, opts.ChatTemplate); err != nil {
			return err
		}
		out.Written = append(out.Written, ChatTemplateName)
		if !slices.Contains(out.Tokenizer, TokenizerConfigName) {
			out.Written = append(out.Written, TokenizerConfigName)
		}
	}
	if slices.Contains(out.Tokenizer, GenerationConfigName) {
		return nil
	}
	gen, err := generationConfig(cfg, opts.Generation)
	if err == nil {
		err = durable.Create(filepath.Join(dir, GenerationConfigName), gen)
	}
	out.Written = append(out.Written, GenerationConfigName)
	return err
}

// checkOutDir refuses a dir that exists and is not an empty directory.
func checkOutDir(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("hf: export: %w", err)
	case len(ents) > 0:
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		return fmt.Errorf("hf: export: %s is not empty (%s): choose a new directory", dir, listSome(names))
	}
	return nil
}

// writeHFShards writes the weight files of shards into dir, streaming the
// chunks produce hands over.
func writeHFShards(dir string, layout *model.Layout, fts []fileTensor, shards []hfShard, dt dtype.DType, produce func(w *ExportWriter) error) (err error) {
	var f *os.File
	var bw *bufio.Writer
	closeFile := func() error {
		if f == nil {
			return nil
		}
		err := bw.Flush()
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		f = nil
		return err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	maxBytes := 0
	for _, ft := range fts {
		maxBytes = max(maxBytes, ft.t.Len*ft.dtypeOr(dt).Size())
	}
	next := 0 // the next shard to start
	w := &ExportWriter{l: layout, dt: dt, fts: fts, buf: make([]byte, maxBytes)}
	w.begin = func(i int) error {
		if next == len(shards) || i != shards[next].first {
			return nil
		}
		if err := closeFile(); err != nil {
			return err
		}
		s := shards[next]
		entries := make([]safetensors.Entry, 0, s.end-s.first)
		for _, ft := range fts[s.first:s.end] {
			fdt := ft.dtypeOr(dt)
			entries = append(entries, safetensors.Entry{Name: ft.name, DType: fdt, Shape: ft.shape, SizeBytes: int64(ft.t.Len * fdt.Size())})
		}
		hdr, err := safetensors.EncodeEntries(entries, map[string]string{"format": "pt"})
		if err != nil {
			return err
		}
		if f, err = os.Create(filepath.Join(dir, s.name)); err != nil {
			return err
		}
		bw = bufio.NewWriterSize(f, 1<<20)
		w.w = bw
		next++
		_, err = bw.Write(hdr)
		return err
	}
	if err := produce(w); err != nil {
		return err
	}
	if w.next != len(layout.Chunks) {
		return fmt.Errorf("export: %d of the layout's %d chunks handed over", w.next, len(layout.Chunks))
	}
	return closeFile()
}
