package hf

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestExportDirRemovesStale: a killed export to OUT left .OUT.tmp-PID-*
// (a dead pid, no lock) holding a config.json and part of a shard, as
// ExportDir leaves them mid-write; the next export to OUT removes it and
// says so in a note, leaves a live export's (this process's pid) and
// writes OUT whole.
func TestExportDirRemovesStale(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("flock and pids: Linux")
	}
	src := t.TempDir()
	llamaFixture.write(t, src, 1)
	root := t.TempDir()
	out := filepath.Join(root, "out")
	c := exec.Command(os.Args[0], "-test.run=^$")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(root, ".out.tmp-"+strconv.Itoa(c.Process.Pid)+"-4242")
	live := filepath.Join(root, ".out.tmp-"+strconv.Itoa(os.Getpid())+"-4243")
	for _, d := range []string{dead, live} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{ConfigName, "model-00001-of-00003.safetensors"} {
			if err := os.WriteFile(filepath.Join(d, name), []byte("{"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, res := importExport(t, src, out, DirOptions{})
	if len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "removed "+dead) || !strings.Contains(res.Notes[0], "which is gone") {
		t.Errorf("notes %q, want one saying %s was removed", res.Notes, dead)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("%s: %v, want it removed", dead, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live export's temporary: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, ConfigName)); err != nil {
		t.Error(err)
	}
	left, _ := filepath.Glob(filepath.Join(root, ".out.tmp-*"))
	if len(left) != 1 || left[0] != live {
		t.Errorf("temporaries after the export: %v, want only %s", left, live)
	}
}
