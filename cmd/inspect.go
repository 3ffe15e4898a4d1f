package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
	"github.com/strata-ai/strata/source"
)

// inspectCommand is `strata inspect PATH`: the tensors and metadata of a
// safetensors file, or the summary of a training checkpoint with its
// checksums verified.
func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "list a safetensors file's tensors, or summarise and verify a training checkpoint",
		UsageText: "strata inspect [--json] [--no-verify] PATH",
		Description: "PATH is a .safetensors file (the header is validated; tensors are listed with dtype, shape,\n" +
			"parameters and bytes, with the metadata), or a checkpoint, named as --resume names it: a run's\n" +
			"--out directory or its checkpoints/ (the \"latest\" is inspected), a step-NNNNNNNN directory, or its manifest.json. For a checkpoint it\n" +
			"prints the manifest (step, devices, stage, shape, states, files) and verifies every rank file's\n" +
			"size and CRC-32C; a mismatch makes the command fail.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			&cli.BoolFlag{Name: "no-verify", Usage: "checkpoints: do not read the rank files to verify their checksums"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("inspect: want one PATH, got %d arguments", c.NArg())
			}
			path := c.Args().First()
			fi, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("inspect: %w", err)
			}
			// A FIFO's open would wait for a writer, a device's read
			// never end: the mode decides before anything is opened.
			if !fi.IsDir() && !fi.Mode().IsRegular() {
				return fmt.Errorf("inspect: %s is %s, not a regular file: inspect reads a .safetensors file or a checkpoint", path, model.FileKind(fi.Mode()))
			}
			if fi.IsDir() || filepath.Base(path) == checkpoint.ManifestName {
				return inspectCheckpoint(c.App.Writer, c.App.ErrWriter, path, c.Bool("json"), !c.Bool("no-verify"))
			}
			return inspectSafetensors(c.App.Writer, path, c.Bool("json"))
		},
	}
}

type inspectTensor struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Params int64   `json:"params"`
	Bytes  int64   `json:"bytes"`
}

type inspectFile struct {
	Path        string            `json:"path"`
	SizeBytes   int64             `json:"size_bytes"`
	HeaderBytes int64             `json:"header_bytes"`
	Params      int64             `json:"params"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Tensors     []inspectTensor   `json:"tensors"`
}

func inspectSafetensors(w io.Writer, path string, asJSON bool) error {
	f, err := safetensors.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := f.Header
	out := inspectFile{Path: path, SizeBytes: h.DataStart() + h.DataBytes, HeaderBytes: h.HeaderBytes, Metadata: h.Metadata,
		Tensors: []inspectTensor{}}
	for _, t := range h.Tensors {
		out.Tensors = append(out.Tensors, inspectTensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Params: t.Elems(), Bytes: t.SizeBytes()})
		out.Params += t.Elems()
	}
	if asJSON {
		return inspectJSON(w, out)
	}
	fmt.Fprintf(w, "%s: %d tensors, %s params, %s (header %s)\n", path, len(out.Tensors), inspectCount(out.Params),
		units.FormatBytes(out.SizeBytes), units.FormatBytes(out.HeaderBytes))
	if len(h.Metadata) > 0 {
		keys := make([]string, 0, len(h.Metadata))
		for k := range h.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintln(w, "metadata:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, k := range keys {
			fmt.Fprintf(tw, "  %s\t%s\n", k, h.Metadata[k])
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

type inspectCkptFile struct {
	checkpoint.FileInfo
	Verified *bool  `json:"verified,omitempty"`
	Error    string `json:"error,omitempty"`
}

type inspectCheckpointOut struct {
	Path        string               `json:"path"`
	Latest      string               `json:"latest,omitempty"`
	Checkpoints []string             `json:"checkpoints,omitempty"`
	Dir         string               `json:"dir"`
	Manifest    *checkpoint.Manifest `json:"manifest"`
	Params      int64                `json:"params"`
	TotalBytes  int64                `json:"total_bytes"`
	Files       []inspectCkptFile    `json:"files"`
}

// resolveCheckpoint finds the checkpoint a user names, the same way for
// train --resume, inspect and export (source.FindCheckpoint): a checkpoint
// directory, its manifest.json, a directory of checkpoints or a run's
// --out directory; with the directory of checkpoints holding it and a note
// for stderr when "latest" could not be read.
func resolveCheckpoint(path string) (dir, list, note string, err error) {
	return source.FindCheckpoint(path)
}

func inspectCheckpoint(w, stderr io.Writer, path string, asJSON, verify bool) error {
	dir, list, note, err := resolveCheckpoint(path)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	printNote(stderr, note)
	var m *checkpoint.Manifest
	var checks []checkpoint.FileCheck
	if verify {
		m, checks, err = checkpoint.Verify(dir)
	} else {
		m, _, err = checkpoint.ReadManifest(dir)
	}
	if err != nil {
		return err
	}
	out := inspectCheckpointOut{Path: path, Dir: dir, Manifest: m, Params: m.ParamCount(), TotalBytes: m.TotalBytes()}
	if list != "" {
		if ls, err := checkpoint.List(list); err == nil {
			out.Latest, out.Checkpoints = ls.Latest, ls.Names()
		}
	}
	var bad []string
	for i, f := range m.Files {
		fo := inspectCkptFile{FileInfo: f}
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
	if asJSON {
		if err := inspectJSON(w, out); err != nil {
			return err
		}
	} else {
		printCheckpoint(w, out)
	}
	if len(bad) > 0 {
		return fmt.Errorf("inspect: %d of %d rank files failed verification: %s", len(bad), len(m.Files), strings.Join(bad, "; "))
	}
	return nil
}

func printCheckpoint(w io.Writer, out inspectCheckpointOut) {
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
	tw.Flush()
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

func inspectJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
