package checkpoint

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPruneRemovesIncomplete: what a removal cut short leaves (a power
// loss that kept a removal's unlinks but not its rename, a kill under an
// older Strata that removed in place): an empty step-NNNNNNNN and one
// whose manifest (this run's) outlived a rank file. The next save removes
// both; it keeps another run's incomplete directory with its manifest and
// every complete checkpoint it does not prune; a prune never removes the
// directory latest names, complete or not.
func TestPruneRemovesIncomplete(t *testing.T) {
	dir := t.TempDir()
	st := filledState(t, 1, 2048, 1)
	save := func(step int64, run string) {
		t.Helper()
		st.Step = step
		if err := SaveWith(dir, st, Options{Keep: 3, RunID: run}); err != nil {
			t.Fatal(err)
		}
	}
	save(1, "other")
	save(2, "r")
	save(3, "r")
	plant := func(name, manifestFrom string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if manifestFrom != "" {
			b, err := os.ReadFile(filepath.Join(dir, manifestFrom, ManifestName))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name, ManifestName), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	plant("step-00000000", "")                // emptied
	plant("step-00000002.1", "step-00000002") // this run's, a rank file gone
	plant("step-00000001.1", "step-00000001") // another run's, a rank file gone
	ls, err := List(dir)
	if err != nil || len(ls.Incomplete) != 3 {
		t.Fatalf("planted: %+v, %v", ls, err)
	}
	save(4, "r")
	ls, err = List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"step-00000001.1 (no rank-00000.safetensors)"}; !slices.Equal(ls.Incomplete, want) {
		t.Errorf("incomplete after the save: %q, want %q", ls.Incomplete, want)
	}
	if got := strings.Join(ls.Names(), ","); got != "step-00000001,step-00000002,step-00000003,step-00000004" {
		t.Errorf("complete after the save: %s", got)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".tmp-*")); len(left) != 0 {
		t.Errorf("temporaries left: %v", left)
	}

	// latest naming an incomplete directory (a hand-edited latest, a
	// damaged disk): pruning leaves it for the user to see.
	plant("step-00000009", "")
	if err := os.WriteFile(filepath.Join(dir, latestName), []byte("step-00000009\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := prune(dir, "step-00000009", &Options{Keep: 3, RunID: "r"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "step-00000009")); err != nil {
		t.Errorf("the incomplete latest: %v", err)
	}
}

// TestManifestFIFO: a manifest.json that is a FIFO makes its directory
// incomplete, read by nobody (List, Resolve and a save's pruning would
// otherwise wait for a writer forever), and the next save removes it.
func TestManifestFIFO(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mkfifo: Linux")
	}
	dir := t.TempDir()
	st := filledState(t, 1, 2048, 1)
	st.Step = 1
	if err := Save(dir, st); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "step-00000005")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(bad, ManifestName), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ls, err := List(dir)
		if err != nil || len(ls.Incomplete) != 1 || !strings.Contains(ls.Incomplete[0], "not a regular file") {
			t.Errorf("list: %+v, %v", ls, err)
		}
		if _, err := Resolve(bad); err == nil {
			t.Errorf("resolve of %s: no error", bad)
		}
		st.Step = 2
		if err := Save(dir, st); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a FIFO manifest was opened")
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("%s after the next save: %v", bad, err)
	}
}
