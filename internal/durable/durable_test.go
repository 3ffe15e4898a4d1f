package durable

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteFile: a write replaces the file whole; a failing fill leaves the
// old file and no temporary one.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	write := func(s string, fail error) error {
		return WriteFile(path, 16, func(w io.Writer) error {
			if _, err := io.WriteString(w, s); err != nil {
				return err
			}
			return fail
		})
	}
	if err := write("old", nil); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := write("new", boom); !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "write "+path) {
		t.Errorf("failing fill: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("after a failed write the file holds %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("a failed write left %d entries", len(ents))
	}
}

// TestCreateAndCopy: Create refuses an existing file; Copy copies, and
// leaves nothing when the source is missing.
func TestCreateAndCopy(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := Create(a, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := Create(a, []byte("y")); err == nil {
		t.Error("Create over an existing file succeeded")
	}
	if err := Copy(b, a); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(b); string(got) != "x" {
		t.Errorf("copy holds %q", got)
	}
	if err := Copy(filepath.Join(dir, "c"), filepath.Join(dir, "missing")); err == nil {
		t.Error("Copy of a missing file succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "c")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed copy left its destination (%v)", err)
	}
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
}
