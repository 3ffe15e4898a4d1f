package run

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/internal/units"
)

// A run records the identity of its training data in every checkpoint
// (checkpoint.DataFile: the size and a SHA-256, of the whole file up to
// dataHashWhole, else of its first, middle and last 64 KiB with the size;
// the mtime is recorded, not compared). A table of several files (a
// directory or a glob of shards, a save_to_disk directory) is recorded
// with the path as given and each of its files, in the order they are
// read, and identified by their names, sizes and hashes. A resumed run
// whose data differs (a file that grew, was rewritten, or another file; a
// shard that changed, appeared or disappeared) is refused in one line
// naming the file and what changed, unless --allow-data-change: it would
// read other rows than the uninterrupted run.

const (
	dataHashWhole  = 1 << 20  // files up to this size are hashed whole
	dataHashSample = 64 << 10 // else three samples of this size
)

// IdentifyData is the identity of the data at path (role "data" or
// "eval-data"): a file, or a table's files (a directory or a glob of
// shards, a save_to_disk directory: data.TableFiles, the DatasetDict
// split the role reads), recorded with path as given.
func IdentifyData(role, path string) (checkpoint.DataFile, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
		id, err := identifyFile(path)
		id.Role = role
		return id, err
	}
	splits := data.TrainSplits
	if role == "eval-data" {
		splits = data.EvalSplits
	}
	files, _, err := data.TableFiles(path, splits)
	if err != nil {
		return checkpoint.DataFile{Role: role, Path: path}, err
	}
	return identifyTable(role, path, files)
}

// identifyTable is the identity of a table's files: each identified as a
// file is, named relative to the table's directory (a glob's: the
// directory it is in), and the whole by their names, sizes and hashes.
func identifyTable(role, path string, files []string) (checkpoint.DataFile, error) {
	id := checkpoint.DataFile{Role: role, Path: path}
	base := path
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		base = filepath.Dir(path)
	}
	h := sha256.New()
	for _, f := range files {
		m, err := identifyFile(f)
		if err != nil {
			return id, err
		}
		if rel, err := filepath.Rel(base, f); err == nil {
			m.Path = rel
		}
		fmt.Fprintf(h, "%s\x00%d\x00%s\n", m.Path, m.Size, m.SHA256)
		id.Size += m.Size
		id.Sampled = id.Sampled || m.Sampled
		if m.ModTime.After(id.ModTime) {
			id.ModTime = m.ModTime
		}
		id.Files = append(id.Files, m)
	}
	id.SHA256 = hex.EncodeToString(h.Sum(nil))
	return id, nil
}

// identifyFile is the identity of the regular file at path: its size and
// SHA-256 (of samples above dataHashWhole).
func identifyFile(path string) (checkpoint.DataFile, error) {
	id := checkpoint.DataFile{Path: path}
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
		// A Stat first: opening a named pipe would block.
		return id, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return id, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return id, err
	}
	if !fi.Mode().IsRegular() {
		return id, fmt.Errorf("%s is not a regular file", path)
	}
	id.Size, id.ModTime = fi.Size(), fi.ModTime().UTC()
	h := sha256.New()
	if id.Size <= dataHashWhole {
		if _, err := io.Copy(h, f); err != nil {
			return id, err
		}
	} else {
		id.Sampled = true
		binary.Write(h, binary.LittleEndian, id.Size)
		buf := make([]byte, dataHashSample)
		for _, off := range []int64{0, (id.Size - dataHashSample) / 2, id.Size - dataHashSample} {
			if _, err := f.ReadAt(buf, off); err != nil {
				return id, err
			}
			h.Write(buf)
		}
	}
	id.SHA256 = hex.EncodeToString(h.Sum(nil))
	return id, nil
}

// DataChange says how the data now differs from was ("" when it is the
// same data): for tables, the first file that changed, appeared or
// disappeared.
func DataChange(was, now checkpoint.DataFile) string {
	name := now.Path
	if now.Path != was.Path {
		name = fmt.Sprintf("%s (the checkpoint's was %s)", now.Path, was.Path)
	}
	switch {
	case (was.Files == nil) != (now.Files == nil):
		what := func(id checkpoint.DataFile) string {
			if id.Files == nil {
				return "a file"
			}
			return fmt.Sprintf("a table of %d files", len(id.Files))
		}
		return fmt.Sprintf("%s was %s, is now %s", name, what(was), what(now))
	case now.Files != nil:
		if c := tableChange(was.Files, now.Files); c != "" {
			return fmt.Sprintf("%s: %s", name, c)
		}
	}
	return fileChange(name, was, now)
}

// tableChange names the first file of a table that appeared, disappeared
// or changed ("" when none did).
func tableChange(was, now []checkpoint.DataFile) string {
	byName := func(ids []checkpoint.DataFile) map[string]checkpoint.DataFile {
		m := map[string]checkpoint.DataFile{}
		for _, id := range ids {
			m[id.Path] = id
		}
		return m
	}
	w, n := byName(was), byName(now)
	for _, id := range was {
		if _, ok := n[id.Path]; !ok {
			return fmt.Sprintf("its file %s disappeared", id.Path)
		}
	}
	for _, id := range now {
		if _, ok := w[id.Path]; !ok {
			return fmt.Sprintf("a file %s appeared", id.Path)
		}
	}
	for _, id := range now {
		if c := fileChange("its file "+id.Path, w[id.Path], id); c != "" {
			return c
		}
	}
	for i := range now {
		if was[i].Path != now[i].Path {
			return fmt.Sprintf("its files are read in another order (%s where %s was)", now[i].Path, was[i].Path)
		}
	}
	return ""
}

// fileChange says how a file (name) now differs from was.
func fileChange(name string, was, now checkpoint.DataFile) string {
	switch {
	case was.Size != now.Size:
		d := now.Size - was.Size
		sign := "+"
		if d < 0 {
			sign, d = "-", -d
		}
		return fmt.Sprintf("%s was %s (%d B), is now %s (%d B, %s%s)", name, units.FormatBytes(was.Size), was.Size,
			units.FormatBytes(now.Size), now.Size, sign, units.FormatBytes(d))
	case was.SHA256 != now.SHA256 || was.Sampled != now.Sampled:
		what := "its SHA-256"
		if was.Sampled {
			what = "the SHA-256 of its first, middle and last 64 KiB"
		}
		return fmt.Sprintf("%s has the same size (%s) but other bytes (%s differs)", name, units.FormatBytes(now.Size), what)
	}
	return ""
}

// identifyRunData is the identity of the run's training data (cfg's
// strata.data), as it is before it is opened. A file that cannot be read
// is left for the data's opening to report.
func identifyRunData(cfg *config.Config) []checkpoint.DataFile {
	if path := cfg.Strata.Data; path != "" {
		if id, err := IdentifyData("data", path); err == nil {
			return []checkpoint.DataFile{id}
		}
	}
	return nil
}

// checkData refuses a resumed run whose training data (ids) differs
// from what its checkpoint recorded, unless r.AllowDataChange (then says
// what changed).
func checkData(r *Resume, ids []checkpoint.DataFile, stderr io.Writer) error {
	if r == nil || len(r.Manifest.Data) == 0 {
		return nil
	}
	var now *checkpoint.DataFile
	if len(ids) > 0 {
		now = &ids[0]
	}
	var was *checkpoint.DataFile
	for i := range r.Manifest.Data {
		if r.Manifest.Data[i].Role == "data" {
			was = &r.Manifest.Data[i]
		}
	}
	var change string
	switch {
	case was == nil && now == nil:
	case was == nil:
		change = fmt.Sprintf("the run trained on the synthetic corpus, and --data is %s", now.Path)
	case now == nil:
		change = fmt.Sprintf("the run trained on %s, and this one would train on the synthetic corpus", was.Path)
	default:
		change = DataChange(*was, *now)
	}
	if change == "" {
		return nil
	}
	if r.AllowDataChange {
		fmt.Fprintf(stderr, "note: --allow-data-change: the training data changed since the checkpoint of step %d: %s; the run goes on with it (its next checkpoints record it)\n",
			r.Manifest.Step, change)
		return nil
	}
	return inputf("train: --resume: the training data changed since the checkpoint of step %d (%s) was saved: %s; on other data the run reads other rows than the one it continues: pass --allow-data-change to go on with it",
		r.Manifest.Step, r.Dir, strings.TrimSpace(change))
}
