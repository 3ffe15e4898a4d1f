package cmd

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInspectRefusesFIFO: inspect of a FIFO (or a device, or a checkpoint
// whose manifest.json is a FIFO) says what it is in one line, without
// opening it (an open for reading would wait for a writer forever).
func TestInspectRefusesFIFO(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mkfifo: Linux")
	}
	fifo := filepath.Join(t.TempDir(), "model.safetensors")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(t.TempDir(), "step-00000001")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(ck, "manifest.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, "/dev/zero", ck, filepath.Join(ck, "manifest.json")} {
		done := make(chan error, 1)
		go func() { _, _, err := run(t, "inspect", path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") || strings.Contains(err.Error(), "\n") {
				t.Errorf("inspect %s: %v, want one line saying it is not a regular file", path, err)
			}
			if path == fifo && !strings.Contains(err.Error(), "FIFO") {
				t.Errorf("inspect %s: %v, want it named a FIFO", path, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("inspect %s hangs", path)
		}
	}
}

// TestExportRemovesStaleTemp: a killed `strata export` left
// .OUT.tmp-PID-* beside OUT (its pid gone, its lock free); the next export
// to OUT removes it and says so.
func TestExportRemovesStaleTemp(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("flock and pids: Linux")
	}
	dir, _ := saveTinyCheckpoint(t)
	gone := exec.Command(os.Args[0], "-test.run=^$")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	file := filepath.Join(outDir, "tiny.safetensors")
	stale := filepath.Join(outDir, ".tiny.safetensors.tmp-"+strconv.Itoa(gone.Process.Pid)+"-31337")
	if err := os.WriteFile(stale, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := run(t, "export", dir, file)
	if err != nil || !strings.Contains(stderr, "note: removed "+stale) {
		t.Fatalf("export: %v, stderr %q; want a note that %s was removed", err, stderr, stale)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("%s: %v", stale, err)
	}
	hfOut := filepath.Join(outDir, "hf")
	staleDir := filepath.Join(outDir, ".hf.tmp-"+strconv.Itoa(gone.Process.Pid)+"-31338")
	if err := os.Mkdir(staleDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err = run(t, "export", "--format", "hf", dir, hfOut); err != nil || !strings.Contains(stderr, "note: removed "+staleDir) {
		t.Fatalf("export --format hf: %v, stderr %q; want a note that %s was removed", err, stderr, staleDir)
	}
	if left, _ := filepath.Glob(filepath.Join(outDir, ".*")); len(left) != 0 {
		t.Errorf("left: %v", left)
	}
}

// TestTrainOutRemovesStaleWeights: a run killed while writing --out's
// model.safetensors left .model.safetensors.tmp-PID-*; the run that
// resumes into the directory removes it when it writes the weights.
func TestTrainOutRemovesStaleWeights(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("flock and pids: Linux")
	}
	cfg := tinyConfig(t)
	dir := t.TempDir()
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "2", "--out", dir, "--save-every", "2")...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	gone := exec.Command(os.Args[0], "-test.run=^$")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, ".model.safetensors.tmp-"+strconv.Itoa(gone.Process.Pid)+"-7")
	if err := os.WriteFile(stale, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := runApp(t, trainArgs(cfg, "--steps", "4", "--resume", dir, "--out", dir)...)
	if err != nil || !strings.Contains(stdout, "note: removed "+stale) {
		t.Fatalf("resumed run: %v, stdout %q, stderr %q; want a note that %s was removed", err, stdout, stderr, stale)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("%s: %v", stale, err)
	}
}
