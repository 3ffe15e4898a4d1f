package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// InspectOptions are Inspect's options; the zero value verifies.
type InspectOptions struct {
	// NoVerify leaves a checkpoint's rank files unread: their sizes and
	// CRC-32C are not checked (InspectedFile.Verified stays nil).
	NoVerify bool
}

// Inspection is what Inspect found: a safetensors file (File) or a
// checkpoint (Checkpoint), one of them set. It is `strata inspect`'s
// output: WriteText its table, WriteJSON its --json object.
type Inspection struct {
	File       *FileInspection
	Checkpoint *CheckpointInspection
	// Note is for the user (stderr): "latest" was missing or unreadable
	// and the newest complete checkpoint was taken instead ("" when not).
	Note string
}

// FileInspection is a safetensors file's header: its tensors and metadata.
type FileInspection struct {
	Path        string            `json:"path"`
	SizeBytes   int64             `json:"size_bytes"`
	HeaderBytes int64             `json:"header_bytes"`
	Params      int64             `json:"params"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Tensors     []TensorInfo      `json:"tensors"`
}

// TensorInfo is one tensor of a safetensors file.
type TensorInfo struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Params int64   `json:"params"`
	Bytes  int64   `json:"bytes"`
}

// CheckpointInspection is a checkpoint's manifest with its rank files'
// verification, and the checkpoints beside it when path named a directory
// of them.
type CheckpointInspection struct {
	Path        string          `json:"path"`
	Latest      string          `json:"latest,omitempty"`
	Checkpoints []string        `json:"checkpoints,omitempty"`
	Dir         string          `json:"dir"`
	Manifest    *Manifest       `json:"manifest"`
	Params      int64           `json:"params"`
	TotalBytes  int64           `json:"total_bytes"`
	Files       []InspectedFile `json:"files"`
}

// InspectedFile is one rank file of an inspected checkpoint.
type InspectedFile struct {
	FileInfo
	// Verified is nil when the file was not read (InspectOptions.NoVerify),
	// else whether its size and CRC-32C match the manifest.
	Verified *bool  `json:"verified,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Inspect is `strata inspect PATH` as one call. PATH is a .safetensors
// file (its header validated; its tensors listed with dtype, shape,
// parameters and bytes, with the metadata), or a checkpoint named as
// Locate names it (a run's --out directory or its checkpoints/, a
// step-NNNNNNNN directory, or its manifest.json): its manifest, and unless
// opts.NoVerify every rank file's size and CRC-32C verified. A rank file
// that fails verification returns the whole Inspection with an error
// naming the files; a manifest that cannot be read returns the Inspection
// with its Note alone (when there is one) and the error.
func Inspect(ctx context.Context, path string, opts InspectOptions) (*Inspection, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	// A FIFO's open would wait for a writer, a device's read
	// never end: the mode decides before anything is opened.
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("inspect: %s is %s, not a regular file: inspect reads a .safetensors file or a checkpoint", path, model.FileKind(fi.Mode()))
	}
	if fi.IsDir() || filepath.Base(path) == ManifestName {
		return inspectCheckpoint(ctx, path, !opts.NoVerify)
	}
	f, err := inspectSafetensors(path)
	if err != nil {
		return nil, err
	}
	return &Inspection{File: f}, nil
}

func inspectSafetensors(path string) (*FileInspection, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := f.Header
	out := &FileInspection{Path: path, SizeBytes: h.DataStart() + h.DataBytes, HeaderBytes: h.HeaderBytes, Metadata: h.Metadata,
		Tensors: []TensorInfo{}}
	for _, t := range h.Tensors {
		out.Tensors = append(out.Tensors, TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape, Params: t.Elems(), Bytes: t.SizeBytes()})
		out.Params += t.Elems()
	}
	return out, nil
}

func inspectCheckpoint(ctx context.Context, path string, verify bool) (*Inspection, error) {
	dir, list, note, err := Locate(path)
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	in := &Inspection{Note: note}
	if err := ctx.Err(); err != nil {
		return in, err
	}
	var m *Manifest
	var checks []FileCheck
	if verify {
		m, checks, err = Verify(dir)
	} else {
		m, _, err = ReadManifest(dir)
	}
	if err != nil {
		return in, err
	}
	out := &CheckpointInspection{Path: path, Dir: dir, Manifest: m, Params: m.ParamCount(), TotalBytes: m.TotalBytes()}
	if list != "" {
		if ls, err := List(list); err == nil {
			out.Latest, out.Checkpoints = ls.Latest, ls.Names()
		}
	}
	var bad []string
	for i, f := range m.Files {
		fo := InspectedFile{FileInfo: f}
		if verify {
			ok := checks[i].Err == nil
			fo.Verified = &ok
			if !ok {
				fo.Error = checks[i].Err.Error()
				bad = append(bad, fo.Error)
			}
		}
		out.Files = append(out.Files, fo)
	}
	in.Checkpoint = out
	if len(bad) > 0 {
		return in, fmt.Errorf("inspect: %d of %d rank files failed verification: %s", len(bad), len(m.Files), strings.Join(bad, "; "))
	}
	return in, nil
}

// MarshalJSON is the JSON of File or of Checkpoint (null when neither).
func (in *Inspection) MarshalJSON() ([]byte, error) {
	switch {
	case in.File != nil:
		return json.Marshal(in.File)
	case in.Checkpoint != nil:
		return json.Marshal(in.Checkpoint)
	}
	return []byte("null"), nil
}

// WriteJSON writes `strata inspect --json`'s object: File's or
// Checkpoint's, indented, with a newline (nothing when neither is set).
func (in *Inspection) WriteJSON(w io.Writer) error {
	var v any
	switch {
	case in.File != nil:
		v = in.File
	case in.Checkpoint != nil:
		v = in.Checkpoint
	default:
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteText writes what `strata inspect` prints: a safetensors file's
// summary, metadata and tensor table, or a checkpoint's manifest with a
// table of its rank files and their checks (nothing when neither is set).
func (in *Inspection) WriteText(w io.Writer) error {
	switch {
	case in.File != nil:
		return in.File.writeText(w)
	case in.Checkpoint != nil:
		return in.Checkpoint.writeText(w)
	}
	return nil
}

func (out *FileInspection) writeText(w io.Writer) error {
	fmt.Fprintf(w, "%s: %d tensors, %s params, %s (header %s)\n", out.Path, len(out.Tensors), inspectCount(out.Params),
		units.FormatBytes(out.SizeBytes), units.FormatBytes(out.HeaderBytes))
	if len(out.Metadata) > 0 {
		keys := make([]string, 0, len(out.Metadata))
		for k := range out.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintln(w, "metadata:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, k := range keys {
			fmt.Fprintf(tw, "  %s\t%s\n", k, out.Metadata[k])
		}
		tw.Flush()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "name\tdtype\tshape\tparams\tbytes")
	for _, t := range out.Tensors {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", t.Name, t.DType, inspectShape(t.Shape), t.Params, t.Bytes)
	}
	return tw.Flush()
}

func (out *CheckpointInspection) writeText(w io.Writer) error {
	m := out.Manifest
	if out.Latest != "" {
		fmt.Fprintf(w, "%s: latest %s (checkpoints: %s)\n", out.Path, out.Latest, strings.Join(out.Checkpoints, ", "))
	}
	fmt.Fprintf(w, "checkpoint %s\n", out.Dir)
	fmt.Fprintf(w, "  step          %d (saved %s)\n", m.Step, m.Created.Format("2006-01-02 15:04:05 MST"))
	if m.Model != "" {
		fmt.Fprintf(w, "  model         %s (custom: its layout is in the manifest)\n", m.Model)
	} else {
		fmt.Fprintf(w, "  shape         %s\n", m.Shape)
	}
	fmt.Fprintf(w, "  devices       %d, ZeRO stage %d, shard alignment %d elements\n", m.Devices, m.Stage, m.ShardAlignElems)
	var states []string
	for _, s := range m.States {
		states = append(states, s.Name+" "+s.DType)
	}
	fmt.Fprintf(w, "  states        %s\n", strings.Join(states, ", "))
	fmt.Fprintf(w, "  chunks        %d, %s params\n", len(m.Chunks), inspectCount(out.Params))
	fmt.Fprintf(w, "  size          %s in %d files\n", units.FormatBytes(out.TotalBytes), len(m.Files))
	if len(m.Config) > 0 {
		fmt.Fprintf(w, "  config        %d bytes of JSON (--json prints it)\n", len(m.Config))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  rank\tfile\tbytes\tcrc32c\tcheck")
	for _, f := range out.Files {
		check := "not verified"
		if f.Verified != nil {
			check = "ok"
			if !*f.Verified {
				check = "FAILED"
			}
		}
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%#08x\t%s\n", f.Rank, f.Name, f.SizeBytes, f.CRC32C, check)
	}
	return tw.Flush()
}

func inspectShape(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func inspectCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
