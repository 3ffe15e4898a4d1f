package run_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/run"
)

// TestCancelSaves: a context cancelled during step 2 of 5 stops the run
// after step 2 as a first Ctrl-C does: the checkpoint of step 2 is saved
// and latest, the outputs are those of step 2, steps.jsonl ends at step
// 2, and Train returns a *run.StoppedError that matches context.Canceled
// and the cancel's cause. A run that ignored the cancel would train 5
// steps and return nil.
func TestCancelSaves(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	why := errors.New("asked to stop")
	var seen []int64
	res, err := run.Train(ctx, run.Options{Config: tinyConfig(5), Out: dir}, func(st run.Step) error {
		seen = append(seen, st.Step)
		if st.Step == 1 {
			cancel(why) // looked at after step 2's end
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, why) {
		t.Fatalf("Train after a cancel: %v, want an error matching context.Canceled and the cause", err)
	}
	var se *run.StoppedError
	if !errors.As(err, &se) || !se.Started || se.Step != 2 || se.Total != 5 || se.Checkpoint == "" {
		t.Fatalf("the stop: %+v, want after step 2 of 5 with its checkpoint", se)
	}
	if res == nil || res.Last != 2 || len(seen) != 2 {
		t.Fatalf("result %+v, steps seen %v: want the run to end after step 2", res, seen)
	}
	m, ck, err := checkpoint.ReadManifest(filepath.Join(dir, "checkpoints"))
	if err != nil || m.Step != 2 || ck != se.Checkpoint {
		t.Fatalf("latest checkpoint: %v %s %v, want step 2 at %s", m, ck, err, se.Checkpoint)
	}
	f, err := os.Open(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last run.StepLine
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			t.Fatal(err)
		}
	}
	if lines != 2 || last.Step != 2 {
		t.Errorf("steps.jsonl: %d lines, the last of step %d; want 2, of step 2", lines, last.Step)
	}
	var sum run.Summary
	if b, err := os.ReadFile(filepath.Join(dir, "summary.json")); err != nil || json.Unmarshal(b, &sum) != nil || sum.Steps != 2 {
		t.Errorf("summary.json: %+v (%v), want the summary of step 2", sum, err)
	}

	// Cancelled before the first step: nothing is trained or written.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	dir2 := t.TempDir()
	_, err = run.Train(ctx2, run.Options{Config: tinyConfig(5), Out: dir2}, func(run.Step) error {
		t.Error("a step ran after the context was cancelled")
		return nil
	})
	if !errors.As(err, &se) || se.Started || !errors.Is(err, context.Canceled) {
		t.Errorf("Train with a cancelled context: %v, want a stop before the first step", err)
	}
	if _, err := os.Stat(filepath.Join(dir2, "steps.jsonl")); err == nil {
		t.Error("a run stopped before its first step wrote steps.jsonl")
	}
}

// TestTrainDataFromConfig: a config's strata.data, with no Options.Data,
// is opened by Train: the run trains on it and its checkpoint records the
// file's identity (the one a resume compares with).
func TestTrainDataFromConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(t.TempDir(), "corpus.txt")
	text := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 300)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := tinyConfig(2)
	cfg.Strata.Data = path
	var progress strings.Builder
	if _, err := run.Train(context.Background(), run.Options{Config: cfg, Out: dir, Progress: &progress}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "data: "+path) {
		t.Errorf("the progress lines do not describe the data:\n%s", progress.String())
	}
	m, _, err := checkpoint.ReadManifest(filepath.Join(dir, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Data) != 1 || m.Data[0].Role != "data" || m.Data[0].Size != int64(len(text)) {
		t.Errorf("the checkpoint records the data as %+v, want %s (%d bytes)", m.Data, path, len(text))
	}
}

// TestTrainRefusesOtherRunsDir: a new run into a directory that holds
// other files is refused with an *run.InputError naming --overwrite, and
// writes nothing there.
func TestTrainRefusesOtherRunsDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := run.Train(context.Background(), run.Options{Config: tinyConfig(2), Out: dir}, nil)
	var ie *run.InputError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "--overwrite") {
		t.Fatalf("Train into a directory of other files: %v, want an InputError naming --overwrite", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "steps.jsonl")); err == nil {
		t.Error("the refused run wrote steps.jsonl")
	}
}
