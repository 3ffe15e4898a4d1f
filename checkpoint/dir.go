package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// The checkpoint directory:
//
//	DIR/latest                     the name of the newest complete checkpoint ("step-00000100\n"),
//	                               replaced by rename
//	DIR/step-00000100/manifest.json
//	DIR/step-00000100/rank-00000.safetensors ... one per rank
//	DIR/.tmp-*                     a save in progress (or one that crashed)
//
// A rank file is a safetensors file whose tensors are "chunk.{c}.{state}"
// (state: param, master, adam_m, adam_v), 1-D, Chunks[c].ShardElems long.

const (
	// FormatName and FormatVersion identify a manifest.
	FormatName    = "strata-checkpoint"
	FormatVersion = 1

	// ManifestName is a checkpoint directory's manifest.
	ManifestName = "manifest.json"

	latestName = "latest"
	stepPrefix = "step-"
	tmpPrefix  = ".tmp-"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Manifest describes one checkpoint; it is manifest.json.
type Manifest struct {
	Format          string          `json:"format"`
	Version         int             `json:"version"`
	Step            int64           `json:"step"`
	Devices         int             `json:"devices"`
	Stage           int             `json:"stage"`
	Shape           model.Shape     `json:"shape,omitzero"`
	Model           string          `json:"model,omitempty"` // a custom model's name (State.Model); no shape then
	LoRA            *model.LoRA     `json:"lora,omitempty"`  // State.LoRA
	FP16            *FP16           `json:"fp16,omitempty"`  // State.FP16
	ShardAlignElems int             `json:"shard_align_elems"`
	Chunks          []ChunkInfo     `json:"chunks"`
	States          []ManifestState `json:"states"`
	Files           []FileInfo      `json:"files"`
	Created         time.Time       `json:"created"`
	Config          json.RawMessage `json:"config,omitempty"`
	// Run is the id of the run that saved it (Options.RunID); pruning
	// and Rewind touch only the checkpoints of one run.
	Run string `json:"run,omitempty"`
	// Source is where the run's initial weights came from
	// (Options.Source); nil for a run from the seeded initialisation.
	Source *hf.Source `json:"source,omitempty"`
	// Data identifies the data files the run trained on (Options.Data), so
	// that a resumed run notices data that changed since; nil for a run
	// without any (the synthetic corpus) or saved before they were recorded.
	Data []DataFile `json:"data,omitempty"`
	// ChatTemplate is the chat template the run rendered its
	// {"messages"} lines with (Options.ChatTemplate); nil for a run
	// without any.
	ChatTemplate *data.ChatTemplate `json:"chat_template,omitempty"`
}

// DataFile identifies a data file a run trained on: its size and the
// SHA-256 of its bytes (the whole file up to 1 MiB, else of its first,
// middle and last 64 KiB with its size: Sampled).
type DataFile struct {
	Role    string    `json:"role"` // "data": the training data
	Path    string    `json:"path"`
	Size    int64     `json:"size_bytes"`
	SHA256  string    `json:"sha256"`
	Sampled bool      `json:"sampled,omitempty"` // SHA256 is of samples, not the whole file
	ModTime time.Time `json:"mtime"`             // recorded, not compared (a copy or a touch changes it)
	// Files are the files of a table (a directory or a glob of Parquet or
	// Arrow shards, a save_to_disk directory) in the order they are read,
	// each identified as a data file is, Path relative to the table's;
	// then Size is theirs summed, SHA256 the hash of their names, sizes
	// and hashes, and Sampled whether any was sampled.
	Files []DataFile `json:"files,omitempty"`
}

// ManifestState is a StateSpec in the manifest: "param" "bf16".
type ManifestState struct {
	Name  string `json:"name"`
	DType string `json:"dtype"`
}

// FileInfo is one rank file: its size and CRC-32C (Castagnoli) over every byte.
type FileInfo struct {
	Rank      int    `json:"rank"`
	Name      string `json:"name"`
	SizeBytes int64  `json:"size_bytes"`
	CRC32C    uint32 `json:"crc32c"`
}

// ParamCount is the number of parameters of the checkpoint's chunks.
func (m *Manifest) ParamCount() int64 {
	var n int64
	for _, c := range m.Chunks {
		n += int64(c.Elems)
	}
	return n
}

// TotalBytes is the size of the rank files.
func (m *Manifest) TotalBytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.SizeBytes
	}
	return n
}

func rankFileName(r int) string { return fmt.Sprintf("rank-%05d.safetensors", r) }

func tensorName(c int, s shard.State) string { return "chunk." + strconv.Itoa(c) + "." + s.String() }

func parseStateName(name string) (shard.State, bool) {
	for s := range shard.StateCount {
		if shard.State(s).String() == name {
			return shard.State(s), true
		}
	}
	return 0, false
}

// Options control Save.
type Options struct {
	// Keep is how many complete checkpoints stay in the directory, the one
	// just saved included (default 2: the new one and the one before).
	// The one "latest" names is never removed.
	Keep int

	// RunID names the run that saves (written to the manifest). Pruning
	// counts and removes only the checkpoints of this run: another run's
	// checkpoints in the same directory are never touched.
	RunID string

	// Source, when set, is recorded in the manifest: where the run's
	// initial weights came from (its tokenizer files, its config.json).
	Source *hf.Source

	// Data, when set, is recorded in the manifest: the data files the run
	// trains on.
	Data []DataFile

	// ChatTemplate, when set, is recorded in the manifest: the chat
	// template of the run's {"messages"} lines, which an export carries.
	ChatTemplate *data.ChatTemplate

	// Hook, for tests, is called at each named point of a save and of its
	// pruning ("write rank-00000.safetensors", "manifest", "rename",
	// "latest", "prune step-NNNNNNNN", "remove .tmp-prune-step-NNNNNNNN");
	// an error stops the save there. ErrCrash stops it without cleaning up,
	// as a crash would. Nil in production.
	Hook func(point string) error
}

// Validate says what is wrong with the options.
func (o Options) Validate() error {
	if o.Keep < 0 {
		return fmt.Errorf("checkpoint: keep %d is negative", o.Keep)
	}
	return nil
}

func (o *Options) defaults() {
	if o.Keep == 0 {
		o.Keep = 2
	}
}

// ErrCrash, returned by a test Hook, simulates a crash: the save stops and
// leaves what it wrote.
var ErrCrash = errors.New("simulated crash")

func (o *Options) at(point string) error {
	if o.Hook == nil {
		return nil
	}
	return o.Hook(point)
}

// Save writes st as the newest checkpoint in dir with default Options.
func Save(dir string, st *State) error { return SaveWith(dir, st, Options{}) }

// SaveWith writes st as the newest checkpoint in dir, crash-safe: the rank
// files and the manifest go to a temporary directory and are fsynced, the
// directory is renamed to step-NNNNNNNN and the parent fsynced, then the
// "latest" file is replaced by rename. A crash at any point leaves "latest"
// naming the previous complete checkpoint or the new one, never a part.
// Older checkpoints beyond opts.Keep are removed afterwards, with leftovers
// of crashed saves. One process saves into a directory at a time.
func SaveWith(dir string, st *State, opts Options) error {
	if err := st.Validate(); err != nil {
		return err
	}
	return save(dir, st.Meta(), func(c, k int, whole []byte) error {
		per := shardBytes(st.States[k], st.Chunks[c].ShardElems)
		for r := range st.Devices {
			copy(whole[r*per:(r+1)*per], st.Data[r][c][k])
		}
		return nil
	}, opts)
}

// save is SaveWith and SaveStream: meta describes the state, fill
// produces its shards.
func save(dir string, meta *State, fill ChunkFunc, opts Options) (err error) {
	if err := opts.Validate(); err != nil {
		return err
	}
	opts.defaults()
	name, tmp, err := prepare(dir, meta, &opts)
	if err != nil {
		return err
	}
	files, err := writeRankFiles(tmp, meta, 0, meta.Devices, fill, &opts)
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("checkpoint: %w", err) // the caller names the step (engine: "save step N")
	}
	return commit(dir, name, tmp, meta, files, &opts)
}

// prepare makes the temporary directory a save writes into and returns
// it with the name the checkpoint will take.
func prepare(dir string, st *State, opts *Options) (name, tmp string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("checkpoint: %w", err)
	}
	if name, err = freeStepName(dir, st.Step, opts.RunID); err != nil {
		return "", "", err
	}
	if tmp, err = os.MkdirTemp(dir, tmpPrefix+name+"-"); err != nil {
		return "", "", fmt.Errorf("checkpoint: %w", err)
	}
	return name, tmp, nil
}

// commit completes a save whose rank files (files) are in tmp: the
// manifest, the rename to name, latest, the pruning. On an error tmp (or
// the renamed directory, never named by latest) is removed, unless a test
// hook simulated a crash.
func commit(dir, name, tmp string, st *State, files []FileInfo, opts *Options) (err error) {
	final := filepath.Join(dir, name)
	renamed := false
	defer func() {
		if err != nil && !errors.Is(err, ErrCrash) {
			os.RemoveAll(tmp)
			if renamed { // complete but never named by latest
				os.RemoveAll(final)
			}
		}
	}()
	m := &Manifest{Format: FormatName, Version: FormatVersion, Step: st.Step, Devices: st.Devices, Stage: st.Stage,
		Shape: st.Shape, Model: st.Model, LoRA: st.LoRA, FP16: st.FP16, ShardAlignElems: st.ShardAlignElems, Chunks: st.Chunks, Created: time.Now().UTC(), Run: opts.RunID, Source: opts.Source, Data: opts.Data, ChatTemplate: opts.ChatTemplate}
	if len(st.Config) > 0 {
		m.Config = json.RawMessage(st.Config)
	}
	for _, s := range st.States {
		m.States = append(m.States, ManifestState{Name: s.Kind.String(), DType: s.DType.String()})
	}
	m.Files = files
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint: manifest: %w", err)
	}
	if err := opts.at("manifest"); err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(tmp, ManifestName), append(mb, '\n')); err != nil {
		return err
	}
	if err := durable.SyncDir(tmp); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := opts.at("rename"); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	renamed = true
	if err := durable.SyncDir(dir); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := opts.at("latest"); err != nil {
		return err
	}
	if err := writeFileAtomicBuf(filepath.Join(dir, latestName), 64, func(w io.Writer) error {
		_, err := io.WriteString(w, name+"\n")
		return err
	}); err != nil {
		return err
	}
	return prune(dir, name, opts)
}

func writeSynced(path string, b []byte) error {
	if err := durable.Create(path, b); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// writeFileAtomicBuf replaces path atomically (durable.WriteFile).
func writeFileAtomicBuf(path string, bufBytes int, fill func(io.Writer) error) error {
	if err := durable.WriteFile(path, bufBytes, fill); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// stepDir is a complete checkpoint directory's name, parsed.
type stepDir struct {
	name   string
	step   int64
	suffix int
}

func parseStepDir(name string) (stepDir, bool) {
	rest, ok := strings.CutPrefix(name, stepPrefix)
	if !ok {
		return stepDir{}, false
	}
	num, suf, hasSuf := strings.Cut(rest, ".")
	step, err := strconv.ParseInt(num, 10, 64)
	if err != nil || step < 0 {
		return stepDir{}, false
	}
	d := stepDir{name: name, step: step}
	if hasSuf {
		if d.suffix, err = strconv.Atoi(suf); err != nil || d.suffix < 1 {
			return stepDir{}, false
		}
	}
	return d, true
}

// freeStepName is step-NNNNNNNN, or step-NNNNNNNN.K when the checkpoint
// "latest" names has that step (a step saved again after a resume) or a
// complete checkpoint of another run holds the name. A directory of that
// step that "latest" does not name, of this run or incomplete, is the
// leftover of a save that crashed before naming it, or an older save of
// the same step: the new save replaces it.
func freeStepName(dir string, step int64, run string) (string, error) {
	ls, err := List(dir)
	if err != nil {
		return "", err
	}
	others := map[string]bool{}
	for _, c := range ls.Complete {
		if c.Run != run {
			others[c.Name] = true
		}
	}
	base := fmt.Sprintf("%s%08d", stepPrefix, step)
	for k := 0; ; k++ {
		name := base
		if k > 0 {
			name = base + "." + strconv.Itoa(k)
		}
		if name == ls.Latest || others[name] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("checkpoint: %w", err)
		}
		return name, nil
	}
}

// listStepDirs returns the directories in dir named like checkpoints,
// complete or not, oldest first.
func listStepDirs(dir string) ([]stepDir, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []stepDir
	for _, e := range ents {
		if d, ok := parseStepDir(e.Name()); ok && e.IsDir() {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].step != out[j].step {
			return out[i].step < out[j].step
		}
		return out[i].suffix < out[j].suffix
	})
	return out, nil
}

// incomplete says why the checkpoint directory dir is not a complete
// checkpoint ("" when it is: a readable manifest and every rank file of
// the manifest's size), and returns its manifest when it has one. The
// CRC-32C is checked by Load and Verify, not here.
func incomplete(dir string) (*Manifest, string) {
	m, err := readManifestFile(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "no " + ManifestName
		}
		return nil, err.Error()
	}
	for _, f := range m.Files {
		fi, err := os.Stat(filepath.Join(dir, f.Name))
		switch {
		case err != nil:
			return m, "no " + f.Name
		case fi.Size() != f.SizeBytes:
			return m, fmt.Sprintf("%s is %d bytes, the manifest says %d", f.Name, fi.Size(), f.SizeBytes)
		}
	}
	return m, ""
}

// prune removes leftovers of crashed saves and removals, and all but the
// keep newest checkpoints of opts.RunID's run, never latest; another
// run's checkpoints are left alone. A checkpoint is renamed to
// .tmp-prune-NAME, and the rename made durable, before it is removed, so
// that a removal cut short leaves no directory that looks like a
// checkpoint. An incomplete directory named like one (an empty or partly
// removed step-NNNNNNNN: a removal cut short before that order, a crash)
// is removed the same way when nothing can claim it: it has no manifest,
// or its manifest is this run's; never latest, and never another run's
// with its manifest.
func prune(dir, latest string, opts *Options) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) || strings.HasPrefix(e.Name(), "."+latestName+".tmp-") {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	ls, err := List(dir)
	if err != nil {
		return err
	}
	drop := func(name string) error {
		if err := opts.at("prune " + name); err != nil {
			return err
		}
		gone := filepath.Join(dir, tmpPrefix+"prune-"+name)
		if err := os.Rename(filepath.Join(dir, name), gone); err != nil {
			errs = append(errs, err)
			return nil
		}
		// The rename reaches the disk before the unlinks do.
		errs = append(errs, durable.SyncDir(dir))
		if err := opts.at("remove " + filepath.Base(gone)); err != nil {
			return err
		}
		errs = append(errs, os.RemoveAll(gone))
		return nil
	}
	for _, in := range ls.Incomplete {
		name, _, _ := strings.Cut(in, " ") // "NAME (why)"
		if name == latest || name == ls.Latest {
			continue
		}
		m, why := incomplete(filepath.Join(dir, name))
		if why == "" || m != nil && m.Run != opts.RunID {
			continue
		}
		if err := drop(name); err != nil {
			return err
		}
	}
	kept := 1 // latest
	for i := len(ls.Complete) - 1; i >= 0; i-- {
		c := ls.Complete[i]
		if c.Name == latest || c.Run != opts.RunID {
			continue
		}
		if kept < opts.Keep {
			kept++
			continue
		}
		if err := drop(c.Name); err != nil {
			return err
		}
	}
	errs = append(errs, durable.SyncDir(dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("checkpoint: saved %s but could not remove old checkpoints: %w", latest, err)
	}
	return nil
}

// Resolve returns the checkpoint directory path names: path itself when it
// holds a manifest, else the one path/latest names. An incomplete
// checkpoint (a save or a removal cut short) is refused, naming the newest
// complete one to resume from instead. A "latest" that is missing or
// cannot be read, beside complete checkpoints, gives the newest of them
// (Find says so in a note); one longer than a checkpoint name can be
// (4 KiB) is refused naming its size, without being read whole.
func Resolve(path string) (string, error) {
	dir, _, err := Find(path)
	return dir, err
}

// Locate finds the checkpoint a user names, the same way for train
// --resume, inspect and export: a checkpoint directory (step-N), its
// manifest.json, a directory of checkpoints (its "latest") or a run's --out
// directory (the "latest" of its checkpoints/). It returns the checkpoint's
// directory, the directory of checkpoints holding it ("" when path named
// the checkpoint itself), and a note for the user when "latest" was
// missing or unreadable and the newest complete checkpoint was taken
// instead (Find).
func Locate(path string) (dir, list, note string, err error) {
	if fi, serr := os.Stat(path); serr == nil && !fi.IsDir() && filepath.Base(path) == ManifestName {
		return filepath.Dir(path), "", "", nil
	}
	dir, note, err = Find(path)
	if err == nil {
		if filepath.Clean(dir) != filepath.Clean(path) {
			list = path
		}
		return dir, list, note, nil
	}
	sub := filepath.Join(path, "checkpoints")
	if _, serr := os.Stat(sub); serr != nil {
		return "", "", "", err
	}
	if dir, note, err = Find(sub); err != nil {
		return "", "", "", err
	}
	return dir, sub, note, nil
}

// Find is Resolve, with a note ("" when none) when path/latest was missing
// or could not be read and the newest complete checkpoint beside it was
// taken instead, for the command to show.
func Find(path string) (dir, note string, err error) {
	if fi, err := os.Stat(filepath.Join(path, ManifestName)); err == nil {
		if !fi.Mode().IsRegular() { // a FIFO's read would wait for a writer
			return "", "", fmt.Errorf("checkpoint: %s is not a regular file (%s)", filepath.Join(path, ManifestName), fi.Mode().Type())
		}
		return path, "", nil
	}
	name, err := readLatest(path)
	var big *latestTooLargeError
	switch {
	case errors.As(err, &big):
		return "", "", fmt.Errorf("checkpoint: %w%s", err, newestHint(path))
	case err != nil:
		if dir, note, ok := fallBack(path, err); ok {
			return dir, note, nil
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(path); serr != nil {
			return "", "", fmt.Errorf("checkpoint: %w", serr)
		}
		if _, ok := parseStepDir(filepath.Base(path)); ok {
			return "", "", fmt.Errorf("checkpoint: %s is an incomplete checkpoint (no %s: a save or a removal was cut short)%s",
				path, ManifestName, newestHint(filepath.Dir(path)))
		}
		return "", "", fmt.Errorf("checkpoint: no checkpoint in %s (neither %s nor %s)", path, latestName, ManifestName)
	}
	if err != nil {
		return "", "", fmt.Errorf("checkpoint: %w", err)
	}
	if _, ok := parseStepDir(name); !ok {
		return "", "", fmt.Errorf("checkpoint: %s names %s, not a checkpoint directory%s", filepath.Join(path, latestName), quotePrefix(name), newestHint(path))
	}
	if _, err := os.Stat(filepath.Join(path, name, ManifestName)); err != nil {
		// A rank file that is short or missing is reported by Load, which
		// checks each one against the manifest.
		return "", "", fmt.Errorf("checkpoint: %s names %s, which is incomplete (no %s)%s", filepath.Join(path, latestName), name, ManifestName, newestHint(path))
	}
	return filepath.Join(path, name), "", nil
}

// newestHint names the newest complete checkpoint in dir for an error:
// "; the newest complete checkpoint is DIR/step-…: resume from it".
func newestHint(dir string) string {
	ls, err := List(dir)
	if err != nil || len(ls.Complete) == 0 {
		return ""
	}
	return fmt.Sprintf("; the newest complete checkpoint is %s: resume from it", filepath.Join(dir, ls.Complete[len(ls.Complete)-1].Name))
}

// readManifestFile reads and checks dir/manifest.json.
func readManifestFile(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestName)
	if fi, err := os.Stat(path); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() { // a FIFO's read would wait for a writer
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if m.Format != FormatName || m.Version != FormatVersion {
		return nil, fmt.Errorf("%s: format %q version %d, this build reads %q version %d", path, m.Format, m.Version, FormatName, FormatVersion)
	}
	if len(m.Files) != m.Devices {
		return nil, fmt.Errorf("%s lists %d files for %d devices", path, len(m.Files), m.Devices)
	}
	for r, f := range m.Files {
		if f.Rank != r || f.Name != rankFileName(r) {
			return nil, fmt.Errorf("%s: file %d is %q for rank %d, want %q", path, r, f.Name, f.Rank, rankFileName(r))
		}
	}
	return &m, nil
}

// ReadManifest reads and checks the manifest of the checkpoint at path
// (a checkpoint directory or the directory holding "latest"), and returns
// it with the checkpoint's directory.
func ReadManifest(path string) (*Manifest, string, error) {
	dir, err := Resolve(path)
	if err != nil {
		return nil, "", err
	}
	m, err := readManifestFile(dir)
	if err != nil {
		return nil, "", fmt.Errorf("checkpoint: %w", err)
	}
	return m, dir, nil
}

func (m *Manifest) specs() ([]StateSpec, error) {
	var out []StateSpec
	for _, s := range m.States {
		kind, ok := parseStateName(s.Name)
		dt, err := dtype.Parse(s.DType)
		if !ok || err != nil {
			return nil, fmt.Errorf("checkpoint: manifest state %q %q unknown", s.Name, s.DType)
		}
		out = append(out, StateSpec{Kind: kind, DType: dt})
	}
	return out, nil
}

// ErrChecksum is matched (errors.Is) by a rank file whose size or CRC-32C
// differs from its manifest.
var ErrChecksum = errors.New("checksum mismatch")

// Load reads the checkpoint at path (the directory Save wrote into, whose
// "latest" names the checkpoint, or a checkpoint directory itself),
// verifying every rank file's size and CRC-32C and every tensor's name,
// dtype and shape, into memory (the checkpoint's size; Open and Read stream
// it instead).
func Load(path string) (*State, error) {
	rd, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return rd.load(rd.meta.Devices, rd.meta.ShardAlignElems)
}

// LoadFor is Load for a run: it refuses a checkpoint of another shape or
// without the run's states, and reshards one saved for another device
// count or shard alignment.
func LoadFor(path string, e Expect) (*State, error) {
	rd, err := OpenFor(path, e)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return rd.load(e.Devices, e.ShardAlignElems)
}

// load reads the whole checkpoint, every state it holds, for devices ranks
// with shard alignment alignElems.
func (rd *Reader) load(devices, alignElems int) (*State, error) {
	st := rd.State()
	st.Devices, st.ShardAlignElems = devices, alignElems
	st.Chunks = make([]ChunkInfo, len(rd.meta.Chunks))
	for c, ch := range rd.meta.Chunks {
		ch.ShardElems = ShardElems(ch.Elems, devices, alignElems)
		st.Chunks[c] = ch
	}
	st.Data = st.alloc()
	err := rd.Read(Expect{Shape: st.Shape, Model: st.Model, LoRA: st.LoRA, Chunks: st.Chunks, Devices: devices, ShardAlignElems: alignElems, States: st.States}, func(c, k int, whole []byte) error {
		per := shardBytes(st.States[k], st.Chunks[c].ShardElems)
		for r := range st.Devices {
			copy(st.Data[r][c][k], whole[r*per:(r+1)*per])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: %w", rd.dir, err)
	}
	return st, nil
}

// FileCheck is the verification of one rank file.
type FileCheck struct {
	FileInfo
	Err error // nil when size and CRC-32C match
}

// Verify checks every rank file of the checkpoint at path against its
// manifest (size and CRC-32C), streaming, without loading the state.
func Verify(path string) (*Manifest, []FileCheck, error) {
	m, dir, err := ReadManifest(path)
	if err != nil {
		return nil, nil, err
	}
	checks := make([]FileCheck, len(m.Files))
	for i, fi := range m.Files {
		checks[i] = FileCheck{FileInfo: fi, Err: verifyFile(filepath.Join(dir, fi.Name), fi)}
	}
	return m, checks, nil
}

func verifyFile(path string, fi FileInfo) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return verifyOpen(f, path, fi)
}

// Listing is what a checkpoint root directory holds.
type Listing struct {
	Latest string // the name "latest" holds; "" without one
	// LatestErr is why "latest" could not be read (Latest is ""): an I/O
	// error, or a file longer than a name; nil when it was, or is absent.
	LatestErr error
	Complete  []Checkpoint // complete checkpoint directories, oldest first, with their step and run
	// Incomplete are the directories named like checkpoints that are not
	// complete (a save or a removal cut short), "NAME (why)"; they are
	// never loaded or counted, and the next save removes those without a
	// manifest or with the saving run's (never latest).
	Incomplete []string
}

// Names are the complete checkpoints' directory names, oldest first.
func (l Listing) Names() []string {
	out := make([]string, len(l.Complete))
	for i, c := range l.Complete {
		out[i] = c.Name
	}
	return out
}

// Checkpoint is one complete checkpoint of a Listing.
type Checkpoint struct {
	Name string
	Step int64
	Run  string // Manifest.Run
}

// List describes the checkpoints in dir (the directory Save writes into).
func List(dir string) (Listing, error) {
	var l Listing
	var err error
	if l.Latest, err = readLatest(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		l.LatestErr = err
	}
	dirs, err := listStepDirs(dir)
	if err != nil {
		return l, fmt.Errorf("checkpoint: %w", err)
	}
	for _, d := range dirs {
		m, why := incomplete(filepath.Join(dir, d.name))
		if why != "" {
			l.Incomplete = append(l.Incomplete, d.name+" ("+why+")")
			continue
		}
		l.Complete = append(l.Complete, Checkpoint{Name: d.name, Step: m.Step, Run: m.Run})
	}
	return l, nil
}

// asidePrefix names a checkpoint set aside by Rewind: no longer one of
// the directory's checkpoints (never loaded, counted or pruned), kept for
// the user to remove.
const asidePrefix = "aside-"

// Rewind makes the complete checkpoint name the latest of dir again, for a
// run that resumes from it into its own directory: "latest" is replaced
// first, then every complete checkpoint of the same run saved after it is
// renamed to aside-NAME (set aside, not removed). It returns the new names
// of those set aside. A crash in between leaves latest naming name, and
// Rewind can be called again.
func Rewind(dir, name string) ([]string, error) {
	ls, err := List(dir)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(ls.Complete, func(c Checkpoint) bool { return c.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("checkpoint: rewind %s to %s: not a complete checkpoint there", dir, name)
	}
	target := ls.Complete[i]
	if ls.Latest != name {
		if err := writeFileAtomicBuf(filepath.Join(dir, latestName), 64, func(w io.Writer) error {
			_, err := io.WriteString(w, name+"\n")
			return err
		}); err != nil {
			return nil, err
		}
	}
	var aside []string
	for _, c := range ls.Complete[i+1:] {
		if c.Run != target.Run {
			continue
		}
		to := asidePrefix + c.Name
		for k := 1; ; k++ {
			if _, err := os.Lstat(filepath.Join(dir, to)); errors.Is(err, fs.ErrNotExist) {
				break
			}
			to = fmt.Sprintf("%s%s-%d", asidePrefix, c.Name, k)
		}
		if err := os.Rename(filepath.Join(dir, c.Name), filepath.Join(dir, to)); err != nil {
			return aside, fmt.Errorf("checkpoint: rewind %s to %s: %w", dir, name, err)
		}
		aside = append(aside, to)
	}
	if err := durable.SyncDir(dir); err != nil {
		return aside, fmt.Errorf("checkpoint: %w", err)
	}
	return aside, nil
}
