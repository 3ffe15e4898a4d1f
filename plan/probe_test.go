package plan

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
)

// TestProbeDisk: the drive's probe gives write, read and mixed rates of
// a small file in a directory and leaves no file behind; a cancelled
// context stops it with an error that says so.
func TestProbeDisk(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the NVMe engine runs on Linux only")
	}
	dir := t.TempDir()
	d, err := ProbeDisk(context.Background(), dir, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if d.Path != dir || !(d.WriteBytesPerS > 0 && d.ReadBytesPerS > 0 && d.MixedBytesPerS > 0) {
		t.Errorf("probe %+v: want positive rates of %s", d, dir)
	}
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Errorf("the probe left %d files in %s", len(names), dir)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ProbeDisk(ctx, dir, 8<<20); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled probe: %v, want context.Canceled", err)
	}
	if _, err := ProbeDisk(context.Background(), dir+"/none", 0); err == nil {
		t.Error("a missing directory: no error")
	}
}
