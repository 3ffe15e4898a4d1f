//go:build unix

package durable

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteFileMode: WriteFile's file is 0644 less the umask, as
// os.WriteFile's and Create's (os.CreateTemp's 0600 made a run's
// model.safetensors and summary.json 0600 beside its 0644 files), under
// umask 022 and 077 alike.
func TestWriteFileMode(t *testing.T) {
	for _, umask := range []int{0o022, 0o077} {
		old := syscall.Umask(umask)
		dir := t.TempDir()
		path := filepath.Join(dir, "model.safetensors")
		err := WriteFile(path, 64, func(w io.Writer) error { _, err := io.WriteString(w, "x"); return err })
		plain := filepath.Join(dir, "config.json")
		if err == nil {
			err = os.WriteFile(plain, []byte("{}"), 0o644)
		}
		syscall.Umask(old)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		pi, _ := os.Stat(plain)
		if want := os.FileMode(0o644 &^ umask); fi.Mode().Perm() != want || pi.Mode().Perm() != want {
			t.Errorf("umask %#o: WriteFile made %v, os.WriteFile %v; want %v", umask, fi.Mode().Perm(), pi.Mode().Perm(), want)
		}
	}
}
