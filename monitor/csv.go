package monitor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CSV is DeepSpeed's csv_monitor: one file per tag in one directory.
type CSV struct {
	dir   string
	files map[string]*csvFile // by file name
}

// csvFile is one tag's open file.
type csvFile struct {
	f    *os.File
	size int64 // the end of the last whole row
}

// CSVFileName is the file DeepSpeed writes tag's rows to: the tag with
// "/" and " " turned into "_", and ".csv".
func CSVFileName(tag string) string {
	return strings.NewReplacer("/", "_", " ", "_").Replace(tag) + ".csv"
}

// csvHeader is the header row's name of tag's value: its last "/" element.
func csvHeader(tag string) string {
	return tag[strings.LastIndex(tag, "/")+1:]
}

// OpenCSV creates dir (with its parents) and returns the CSV monitor that
// writes into it. The files already there are appended to, as DeepSpeed
// appends ('a+'); a row cut short by a crash is dropped first. resumeX > 0
// is the x of the step a resumed run goes on after: rows past it (written
// after the checkpoint the run resumes from) are dropped, as steps.jsonl
// drops its lines past the resumed step.
func OpenCSV(dir string, resumeX int64) (*CSV, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("monitor: csv: %w", err)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.csv"))
	if err != nil {
		return nil, fmt.Errorf("monitor: csv: %w", err)
	}
	for _, name := range names {
		if err := trimCSV(name, resumeX); err != nil {
			return nil, fmt.Errorf("monitor: csv: %w", err)
		}
	}
	return &CSV{dir: dir, files: map[string]*csvFile{}}, nil
}

// trimCSV cuts path after its last whole row and, with resumeX > 0,
// before its first row whose step is past resumeX. Rows are appended in
// step order, so the rest of the file is past it too.
func trimCSV(path string, resumeX int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var off int64
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			break // line, if any, is a row cut short
		}
		if err != nil {
			return err
		}
		first, _, _ := bytes.Cut(line, []byte(","))
		if x, perr := strconv.ParseInt(string(first), 10, 64); perr == nil && resumeX > 0 && x > resumeX {
			break
		}
		off += int64(len(line))
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() == off {
		return nil
	}
	return f.Truncate(off)
}

// Path is the directory.
func (c *CSV) Path() string { return c.dir }

// WriteEvents appends a row to each event's file, opened (and given its
// header, when empty) at its tag's first event. A row the disk refuses is
// cut back off and the rest of the step is not written.
func (c *CSV) WriteEvents(events []Event) error {
	var row []byte
	for _, ev := range events {
		name := CSVFileName(ev.Tag)
		cf, err := c.file(name)
		if err != nil {
			return err
		}
		row = row[:0]
		if cf.size == 0 {
			row = appendCSVRow(row, "step", csvHeader(ev.Tag))
		}
		row = appendCSVRow(row, strconv.FormatInt(ev.X, 10), FormatPython(ev.Value))
		if _, err := cf.f.Write(row); err != nil {
			cf.f.Truncate(cf.size) // no torn row for the next one to follow
			return fmt.Errorf("monitor: csv: %w", err)
		}
		cf.size += int64(len(row))
	}
	return nil
}

// file returns the open file name of the directory.
func (c *CSV) file(name string) (*csvFile, error) {
	if cf := c.files[name]; cf != nil {
		return cf, nil
	}
	f, err := os.OpenFile(filepath.Join(c.dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("monitor: csv: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("monitor: csv: %w", err)
	}
	cf := &csvFile{f: f, size: st.Size()}
	c.files[name] = cf
	return cf, nil
}

// Close closes the files.
func (c *CSV) Close() error {
	var errs []error
	for _, cf := range c.files {
		if err := cf.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("monitor: csv: %w", err))
		}
	}
	c.files = map[string]*csvFile{}
	return errors.Join(errs...)
}

// appendCSVRow appends fields as Python's csv.writer writes them (the
// "excel" dialect: quoted only when they hold a comma, a quote or a line
// break, quotes doubled; rows end in "\r\n").
func appendCSVRow(dst []byte, fields ...string) []byte {
	for i, s := range fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		if strings.ContainsAny(s, ",\"\r\n") {
			dst = append(dst, '"')
			dst = append(dst, strings.ReplaceAll(s, `"`, `""`)...)
			dst = append(dst, '"')
		} else {
			dst = append(dst, s...)
		}
	}
	return append(dst, '\r', '\n')
}
