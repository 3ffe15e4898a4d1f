package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/strata-ai/strata/model"
)

// A table is a data set of rows, an example each, in Parquet or Arrow IPC
// files: one file, a directory or a glob of shards (read in the order of
// their names), or a directory written by Hugging Face's
// datasets.save_to_disk (its state.json lists its Arrow stream files in
// order; a DatasetDict's dataset_dict.json names its splits, each in a
// subdirectory). Its rows are read a batch at a time (a Parquet row
// group, an Arrow record batch: tableBuild holds one) and tokenized into
// the token file as JSONL lines are, through encoder.example.

// tableFile is one file of a table.
type tableFile struct {
	path   string
	format Format // Parquet or Arrow
	size   int64
}

// table is the files a table path names, and the DatasetDict split they
// are ("" when none).
type table struct {
	files []tableFile
	split string
}

// jsonBytesMax bounds a save_to_disk directory's state.json and
// dataset_dict.json, read whole: a few KiB in practice.
const jsonBytesMax = 16 << 20

// isGlob says whether path has glob metacharacters.
func isGlob(path string) bool { return strings.ContainsAny(path, "*?[") }

// globFiles is the files a glob matches, in the order of their names.
func globFiles(pattern string) ([]tableFile, error) {
	names, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", pattern, err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("data: %s: %w: no file matches the glob", pattern, fs.ErrNotExist)
	}
	slices.Sort(names)
	return tableFiles(pattern, names)
}

// tableFiles checks that names (of the table path) are regular Parquet or
// Arrow files, all of one format, by their magic bytes.
func tableFiles(path string, names []string) ([]tableFile, error) {
	files := make([]tableFile, 0, len(names))
	for _, name := range names {
		if err := checkRegular(name); err != nil {
			return nil, err
		}
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("data: %w", err)
		}
		head := make([]byte, 8)
		n, _ := io.ReadFull(f, head)
		format, err := tableMagic(f, name, head[:n], fi.Size())
		f.Close()
		switch {
		case err != nil:
			return nil, err
		case format == Text:
			return nil, fmt.Errorf("data: %s: %s is neither Parquet nor Arrow (no PAR1, ARROW1 or stream marker at its start)", path, name)
		case len(files) > 0 && format != files[0].format:
			return nil, fmt.Errorf("data: %s: %s is %s and %s is %s: give the shards of one format", path, files[0].path, files[0].format, name, format)
		}
		files = append(files, tableFile{path: name, format: format, size: fi.Size()})
	}
	return files, nil
}

// dirFormat is the format of a directory's table: Arrow for a
// save_to_disk directory, else that of its .parquet files, else that of
// its .arrow files.
func dirFormat(dir string) (Format, error) {
	for _, name := range []string{"dataset_dict.json", "state.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return Arrow, nil
		}
	}
	for _, c := range []struct {
		ext    string
		format Format
	}{{".parquet", Parquet}, {".arrow", Arrow}} {
		if names, _ := filepath.Glob(filepath.Join(dir, "*"+c.ext)); len(names) > 0 {
			return c.format, nil
		}
	}
	return 0, fmt.Errorf("data: %s: %w (directory) without .parquet or .arrow files, state.json or dataset_dict.json: give a data file, a directory of Parquet or Arrow shards, or a datasets.save_to_disk directory", dir, model.ErrNotRegular)
}

// openTableFiles is the table at path: a file, a directory or a glob of
// shards, or a save_to_disk directory (a DatasetDict's first split of
// splits).
func openTableFiles(path string, splits []string) (*table, error) {
	fi, err := os.Stat(path)
	switch {
	case err != nil && isGlob(path):
		files, err := globFiles(path)
		return &table{files: files}, err
	case err != nil:
		return nil, fmt.Errorf("data: %w", err)
	case !fi.IsDir():
		files, err := tableFiles(path, []string{path})
		return &table{files: files}, err
	}
	t := &table{}
	dir := path
	if raw, err := readSmall(filepath.Join(path, "dataset_dict.json")); err == nil {
		var dd struct {
			Splits []string `json:"splits"`
		}
		if err := json.Unmarshal(raw, &dd); err != nil {
			return nil, fmt.Errorf("data: %s: dataset_dict.json: %w", path, err)
		}
		for _, s := range splits {
			if slices.Contains(dd.Splits, s) {
				t.split = s
				break
			}
		}
		if t.split == "" {
			return nil, fmt.Errorf("data: %s: a DatasetDict of splits %s, none of them %s", path, strings.Join(dd.Splits, ", "), strings.Join(splits, " or "))
		}
		dir = filepath.Join(path, t.split)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	raw, err := readSmall(filepath.Join(dir, "state.json"))
	if err == nil {
		var state struct {
			DataFiles []struct {
				Filename string `json:"filename"`
			} `json:"_data_files"`
		}
		if err := json.Unmarshal(raw, &state); err != nil {
			return nil, fmt.Errorf("data: %s: state.json: %w", dir, err)
		}
		if len(state.DataFiles) == 0 {
			return nil, fmt.Errorf("data: %s: state.json lists no _data_files", dir)
		}
		var names []string
		for _, d := range state.DataFiles {
			name := filepath.Join(dir, filepath.Base(d.Filename))
			if _, err := os.Stat(name); err != nil {
				return nil, fmt.Errorf("data: %s: state.json names %s, which is missing: %w", dir, d.Filename, err)
			}
			names = append(names, name)
		}
		t.files, err = tableFiles(path, names)
		return t, err
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if t.split != "" {
		return nil, fmt.Errorf("data: %s: the DatasetDict's split %s has no state.json: %w", path, t.split, err)
	}
	format, err := dirFormat(path)
	if err != nil {
		return nil, err
	}
	names, _ := filepath.Glob(filepath.Join(path, "*."+format.String()))
	if len(names) == 0 {
		return nil, fmt.Errorf("data: %s: no .%s files", path, format)
	}
	slices.Sort(names)
	t.files, err = tableFiles(path, names)
	return t, err
}

// readSmall reads a small JSON file of a save_to_disk directory.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, jsonBytesMax+1))
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if len(b) > jsonBytesMax {
		return nil, fmt.Errorf("data: %s: more than %d bytes", path, jsonBytesMax)
	}
	return b, nil
}

// openTable tokenizes the table at path into a token file in o.Dir.
func openTable(path string, format Format, o Options) (*Source, error) {
	splits := o.Splits
	if splits == nil {
		splits = TrainSplits
	}
	t, err := openTableFiles(path, splits)
	if err != nil {
		return nil, err
	}
	if got := t.files[0].format; got != format {
		return nil, fmt.Errorf("data: %s: is %s, not %s", path, got, format)
	}
	w, err := newTokenWriter(o.Dir, o.Tokenizer.VocabSize())
	if err != nil {
		return nil, err
	}
	b := newTableBuild(w, o, memory.DefaultAllocator)
	st, err := b.build(path, t)
	if err != nil {
		w.close()
		return nil, err
	}
	tf, err := w.finish()
	if err != nil {
		return nil, err
	}
	st.Width, st.Bytes = tf.Width(), tf.Bytes()
	return &Source{Path: path, Stats: st, File: tf, closer: tf}, nil
}

// TableFiles lists the files of the table at path (a Parquet or Arrow
// file, a directory or a glob of shards, a save_to_disk directory; a
// DatasetDict's first split of splits, nil: TrainSplits) in the order
// they are read, and the split ("" when none): what a run's record of its
// data identifies.
func TableFiles(path string, splits []string) (files []string, split string, err error) {
	if splits == nil {
		splits = TrainSplits
	}
	t, err := openTableFiles(path, splits)
	if err != nil {
		return nil, "", err
	}
	for _, f := range t.files {
		files = append(files, f.path)
	}
	return files, t.split, nil
}
