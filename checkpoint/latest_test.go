package checkpoint

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// savedTwo is a directory of checkpoints of steps 100 and 200 (latest
// names step 200).
func savedTwo(t *testing.T) (dir string, newest *State) {
	t.Helper()
	dir = t.TempDir()
	if err := Save(dir, filledState(t, 2, 2048, 1)); err != nil {
		t.Fatal(err)
	}
	newest = filledState(t, 2, 2048, 2)
	newest.Step = 200
	if err := SaveWith(dir, newest, Options{Keep: 2}); err != nil {
		t.Fatal(err)
	}
	return dir, newest
}

// TestLatestTooLarge: a "latest" longer than a checkpoint name can be
// (200 MB here, sparse, as in the issue, where it cost 1.38 GB of RSS and
// a 200 MB error line) is refused naming the file and its size, quoting
// only its first bytes, and naming the newest complete checkpoint; it is
// not read whole (the bytes allocated stay under 1 MiB).
func TestLatestTooLarge(t *testing.T) {
	dir, _ := savedTwo(t)
	latest := filepath.Join(dir, latestName)
	const size = 200 << 20
	f, err := os.Create(latest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(strings.Repeat("step-00000200 garbage ", 400)); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for name, fn := range map[string]func() error{
		"Resolve": func() error { _, err := Resolve(dir); return err },
		"Load":    func() error { _, err := Load(dir); return err },
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := fn()
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatalf("%s: a %d-byte latest accepted", name, size)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("%s allocated %d bytes for a %d-byte latest: read whole", name, n, size)
		}
		msg := err.Error()
		want := latest + ` is 200.0 MiB (209715200 bytes), not a checkpoint name (at most 4096 bytes): it starts "step-00000200 garbage step-00000200 garb"…`
		if !strings.Contains(msg, want) || !strings.Contains(msg, "the newest complete checkpoint is "+filepath.Join(dir, "step-00000200")) || len(msg) > 600 {
			t.Errorf("%s: got %d bytes: %.600s\nwant %q and the newest complete checkpoint", name, len(msg), msg, want)
		}
	}
	ls, err := List(dir)
	if err != nil || ls.Latest != "" || ls.LatestErr == nil || len(ls.Complete) != 2 {
		t.Errorf("List: latest %q (%v), %d complete, %v", ls.Latest, ls.LatestErr, len(ls.Complete), err)
	}
}

// TestLatestMissingFallsBack: a deleted or unreadable "latest" beside
// complete checkpoints gives the newest complete one (its manifest read
// and its files checked), with a note saying so; an incomplete newer one
// is passed over; with no complete checkpoint it is still "no
// checkpoint".
func TestLatestMissingFallsBack(t *testing.T) {
	dir, newest := savedTwo(t)
	latest := filepath.Join(dir, latestName)
	// An incomplete step 300 (a save cut short after its rename) is not taken.
	if err := os.Mkdir(filepath.Join(dir, "step-00000300"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		break_ func(t *testing.T)
		why    string
	}{
		{"deleted", func(t *testing.T) { os.Remove(latest) }, latest + " is missing; "},
		{"directory", func(t *testing.T) {
			os.Remove(latest)
			if err := os.Mkdir(latest, 0o755); err != nil {
				t.Fatal(err)
			}
		}, latest + " could not be read (" + latest + " is not a regular file (d---------)); "},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.break_(t)
			defer os.RemoveAll(latest)
			got, note, err := Find(dir)
			want := filepath.Join(dir, "step-00000200")
			if err != nil || got != want || !strings.HasPrefix(note, c.why) || !strings.Contains(note, "using the newest complete checkpoint beside it, "+want+" (step 200)") {
				t.Fatalf("Find: %q, note %q, %v; want %s with a note starting %q", got, note, err, want, c.why)
			}
			st, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			sameState(t, st, newest)
		})
	}
	// No complete checkpoint: the error it always was.
	empty := t.TempDir()
	if _, err := Resolve(empty); err == nil || !strings.Contains(err.Error(), "no checkpoint in "+empty) {
		t.Errorf("empty directory: %v", err)
	}
}
