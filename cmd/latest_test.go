package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A run whose checkpoints/latest was deleted resumes, exports and inspects
// from the newest complete checkpoint beside it, saying so in one note,
// instead of "no checkpoint"; a 200 MB latest is refused naming its size,
// in a short line.
func TestLatestMissingResume(t *testing.T) {
	out := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--steps", "4", "--save-every", "2", "--no-progress", "--out", out); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	ck := filepath.Join(out, "checkpoints")
	latest := filepath.Join(ck, "latest")
	if err := os.Remove(latest); err != nil {
		t.Fatal(err)
	}
	note := "note: " + latest + " is missing; using the newest complete checkpoint beside it, " + filepath.Join(ck, "step-00000004") + " (step 4)"
	stdout, stderr, err := runApp(t, "inspect", out)
	if err != nil || !strings.Contains(stderr, note) || !strings.Contains(stdout, "step-00000004") {
		t.Errorf("inspect: %v\nstdout %s\nstderr %s\nwant %q", err, stdout, stderr, note)
	}
	if _, stderr, err := runApp(t, "export", out, filepath.Join(t.TempDir(), "w.safetensors")); err != nil || !strings.Contains(stderr, note) {
		t.Errorf("export: %v\n%s\nwant %q", err, stderr, note)
	}
	_, stderr, err = runApp(t, "train", "--resume", out, "--out", out, "--steps", "6", "--save-every", "2", "--no-progress")
	if err != nil || !strings.Contains(stderr, note) || !strings.Contains(stderr, "resumed from step 4") {
		t.Fatalf("resume: %v\n%s\nwant %q", err, stderr, note)
	}
	// The resumed run's saves wrote latest again.
	if b, err := os.ReadFile(latest); err != nil || strings.TrimSpace(string(b)) != "step-00000006" {
		t.Errorf("latest after the resumed run: %q, %v", b, err)
	}

	f, err := os.Create(latest)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(strings.Repeat("x", 10000))
	f.Truncate(200 << 20)
	f.Close()
	_, _, err = runApp(t, "inspect", out)
	if err == nil || !strings.Contains(err.Error(), latest+" is 200.0 MiB (209715200 bytes), not a checkpoint name") || len(err.Error()) > 600 {
		t.Errorf("a 200 MB latest: %.600v", err)
	}
}
