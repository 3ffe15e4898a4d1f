package nvme

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/flock"
	"github.com/strata-ai/strata/internal/units"
)

// TestCheckSwapSpaceReclaimable: a path whose free space (statfs, replaced
// here) is below what the swap needs there is refused with ErrNoSpace,
// naming the path, the need, the free space and what the stale swap files
// of killed runs hold (reclaimable), one of them by name; a swap file a
// live run holds (its flock taken on another open file) is not counted.
// Where the space is there, nothing is refused.
func TestCheckSwapSpaceReclaimable(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "strata-999999-0123456789ab.swap")
	if err := os.WriteFile(stale, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	held := filepath.Join(dir, "strata-999998-0123456789ab.swap")
	if err := os.WriteFile(held, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := flock.TryLock(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	st, err := StaleSwapFiles(dir)
	if err != nil || len(st) != 1 {
		t.Fatalf("stale %v %v, want %s alone", st, err, stale)
	}
	old := freeBytes
	defer func() { freeBytes = old }()
	freeBytes = func(string) (int64, error) { return 1 << 20, nil }
	err = CheckSwapSpace([]string{dir}, 4<<20, 256<<10)
	want := dir + " needs " + units.FormatBytes(4<<20) + ", only " + units.FormatBytes(1<<20) + " free, " + units.FormatBytes(st[0].SizeBytes) + " reclaimable (1 stale swap files"
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), stale) || strings.Contains(err.Error(), held) {
		t.Fatalf("got  %v\nwant ErrNoSpace with %q and %s", err, want, stale)
	}
	freeBytes = func(string) (int64, error) { return 4 << 20, nil }
	if err := CheckSwapSpace([]string{dir}, 4<<20, 256<<10); err != nil {
		t.Fatalf("4 MiB of 4 MiB free: %v", err)
	}
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("CheckSwapSpace removed a file: %v", err)
	}
}

// TestNewSwapNoSpaceSaysReclaimable: NewSwap's own refusal of a path short
// of space says the same (reclaimable, the stale file), and leaves nothing
// behind.
func TestNewSwapNoSpaceSaysReclaimable(t *testing.T) {
	dir := diskDir(t)
	stale := filepath.Join(dir, "strata-999999-0123456789ab.swap")
	if err := os.WriteFile(stale, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	old := freeBytes
	defer func() { freeBytes = old }()
	freeBytes = func(string) (int64, error) { return 1 << 20, nil }
	e := openEngine(t, EnginePread, 2)
	s, err := NewSwap(e, SwapOptions{Paths: []string{dir}, SizeBytes: 4 << 20, StripeBytes: 256 << 10})
	if err == nil {
		s.Close()
		t.Fatal("4 MiB swap on 1 MiB free: accepted")
	}
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), " reclaimable (1 stale swap files") || !strings.Contains(err.Error(), stale) {
		t.Errorf("got %v", err)
	}
	if names, _ := filepath.Glob(filepath.Join(dir, "*.swap")); len(names) != 1 {
		t.Errorf("files after the refusal: %v, want the stale one alone", names)
	}
}

// TestSweepNeverTakesANewSwapFile: a run's start-up sweep of stale files
// (RemoveStaleSwapFiles, here in a loop) never removes the file another
// Swap is creating on the same path: the file appears under its name only
// once locked, and a name a closing run removed is not reported as
// reclaimed. Before, the instant between create and flock let the sweep
// remove live files (a few in 300 here), and a sweep that opened a file
// just before its run closed reported it as a stale file it removed.
func TestSweepNeverTakesANewSwapFile(t *testing.T) {
	dir := diskDir(t)
	e := openEngine(t, EnginePread, 2)
	stop := make(chan struct{})
	done := make(chan []StaleFile)
	go func() {
		var removed []StaleFile
		for {
			select {
			case <-stop:
				done <- removed
				return
			default:
			}
			rm, _ := RemoveStaleSwapFiles(dir)
			removed = append(removed, rm...)
		}
	}()
	for range 300 {
		s, err := NewSwap(e, SwapOptions{Paths: []string{dir}, SizeBytes: 256 << 10, StripeBytes: 256 << 10})
		if err != nil {
			close(stop)
			<-done
			t.Fatal(err)
		}
		name := s.Files()[0].Path()
		if _, err := os.Stat(name); err != nil {
			t.Errorf("a live swap file was removed: %v", err)
		}
		s.Close()
	}
	close(stop)
	if removed := <-done; len(removed) != 0 {
		t.Errorf("the sweep removed %d live swap files, e.g. %s", len(removed), removed[0].Path)
	}
}
