package cmd

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestRunFilesMode: every file a run and an export write has one mode,
// that of config.json (0644 less the umask): model.safetensors,
// summary.json, checkpoints/latest and the export's files were 0600
// (written through temporary files made 0600) beside 0644 ones.
func TestRunFilesMode(t *testing.T) {
	out := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--steps", "2", "--save-every", "2", "--no-progress", "--out", out); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	exp := filepath.Join(t.TempDir(), "w.safetensors")
	if _, stderr, err := runApp(t, "export", out, exp); err != nil {
		t.Fatalf("export: %v\n%s", err, stderr)
	}
	ref, err := os.Stat(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := ref.Mode().Perm()
	n := 0
	check := func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n++
		if fi.Mode().Perm() != want {
			t.Errorf("%s is %v, config.json %v", path, fi.Mode().Perm(), want)
		}
		return nil
	}
	if err := filepath.WalkDir(out, check); err != nil {
		t.Fatal(err)
	}
	if err := check(exp, fs.FileInfoToDirEntry(mustStat(t, exp)), nil); err != nil {
		t.Fatal(err)
	}
	if n < 6 {
		t.Errorf("%d files checked", n)
	}
}

func mustStat(t *testing.T, path string) fs.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}
