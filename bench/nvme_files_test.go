//go:build linux

package bench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/leaktest"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestRunNVMeKeepsExistingFile: an existing file is a user's file (a
// model, a dataset). A write run on it is refused and leaves it byte for
// byte as it was; a read run never changes its size (an empty file, or one
// shorter than --size, is refused rather than extended); a read run within
// its size reads it and changes nothing. --force allows the write.
func TestRunNVMeKeepsExistingFile(t *testing.T) {
	leaktest.Check(t)
	d := nvmetest.Dir(t)
	model := filepath.Join(d, "model.safetensors")
	want := make([]byte, 4<<20)
	fillRandom(want, 42)
	if err := os.WriteFile(model, want, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(d, "empty.bin")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(path, rw string, size int64, force bool) (NVMeResult, error) {
		o := NVMeOptions{Paths: []string{path}, RW: rw, BlockBytes: 64 << 10, QueueDepth: 4, SizeBytes: size, Force: force}
		return RunNVMe(context.Background(), o.WithDefaults())
	}
	unchanged := func(what string) {
		t.Helper()
		got, err := os.ReadFile(model)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: %s changed (%d bytes now)", what, model, len(got))
		}
		if st, err := os.Stat(empty); err != nil || st.Size() != 0 {
			t.Fatalf("%s: %s: %v, size %d; want it empty", what, empty, err, st.Size())
		}
	}
	for _, c := range []struct {
		path, rw string
		size     int64
		want     []string
	}{
		{model, "write", 4 << 20, []string{"--rw write would overwrite " + model, "--force"}},
		{model, "randwrite", 1 << 20, []string{"would overwrite " + model}},
		{model, "mixed", 4 << 20, []string{"would overwrite " + model}},
		{model, "read", 8 << 20, []string{model + " holds 4.0 MiB (4194304 bytes)", "--size 4194304 or less", "--force to extend"}},
		{empty, "read", 1 << 20, []string{empty + " holds 0 B (0 bytes)", "--force"}},
		{empty, "randread", 1 << 20, []string{empty + " holds 0 B (0 bytes)"}},
	} {
		_, err := run(c.path, c.rw, c.size, false)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s %s: got %v, want an error containing %q", c.rw, c.path, err, w)
			}
		}
		unchanged(c.rw + " " + c.path)
	}
	for _, rw := range []string{"read", "randread"} {
		if r, err := run(model, rw, 4<<20, false); err != nil || r.Bytes != 4<<20 {
			t.Fatalf("%s within the file: %v (%d bytes)", rw, err, r.Bytes)
		}
		unchanged(rw + " within the file")
	}
	if _, err := run(model, "write", 4<<20, true); err != nil {
		t.Fatalf("write with --force: %v", err)
	}
	if got, _ := os.ReadFile(model); bytes.Equal(got, want) || len(got) != len(want) {
		t.Fatalf("write with --force: the file was not overwritten in place (%d bytes)", len(got))
	}
	if _, err := run(empty, "read", 1<<20, true); err != nil {
		t.Fatalf("read with --force: %v", err)
	}
	if st, _ := os.Stat(empty); st.Size() != 1<<20 {
		t.Fatalf("read with --force: size %d, want it extended to 1 MiB", st.Size())
	}
	noLeftovers(t, d)
}

// TestRunNVMeStopped: a run whose context is cancelled (as cmd does on
// SIGINT) stops, says so and removes its temporary file, both before the
// workload and during it.
func TestRunNVMeStopped(t *testing.T) {
	leaktest.Check(t)
	d := nvmetest.Dir(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	stopped := context.Canceled
	o := NVMeOptions{Paths: []string{d}, RW: "write", BlockBytes: 64 << 10, QueueDepth: 4, SizeBytes: 4 << 20, Loops: 1 << 20}.WithDefaults()
	o.ProgressTick = 1
	o.Progress = func(done, _ int64, _ time.Duration) {
		if done > 0 {
			cancel(stopped)
		}
	}
	_, err := RunNVMe(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "stopped after") || !errors.Is(err, stopped) {
		t.Fatalf("cancelled mid-run: %v", err)
	}
	noLeftovers(t, d)
	o.RW = "read" // cancelled already: stops while preparing the file
	if _, err := RunNVMe(ctx, o); err == nil || !errors.Is(err, stopped) {
		t.Fatalf("cancelled before the run: %v", err)
	}
	noLeftovers(t, d)
}
