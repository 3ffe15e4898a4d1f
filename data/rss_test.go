package data

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/hosttest"
)

// TestMain runs the test binary as a child that streams a data file
// (dataChild) when STRATA_DATA_CHILD names one.
func TestMain(m *testing.M) {
	if path := os.Getenv("STRATA_DATA_CHILD"); path != "" {
		if err := dataChild(path, os.Getenv("STRATA_DATA_DIR")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// dataChild does what a run does with a JSONL file: tokenizes it into a
// token file in dir, then reads every row of its first two epochs (packed
// in rows of 256, shuffled) and every row of it as an eval set.
func dataChild(path, dir string) error {
	src, err := Open(path, Options{Dir: dir})
	if err != nil {
		return err
	}
	defer src.Close()
	p, err := NewPacked(src.File, 256, 1, true)
	if err != nil {
		return err
	}
	rows, err := p.EpochStart(2)
	if err != nil {
		return err
	}
	b := emptyBatch(64, 256) // reused: the rows' garbage would be the child's largest
	for first := int64(0); first+64 <= rows; first += 64 {
		if err := p.RowsInto(&b, first); err != nil {
			return err
		}
	}
	ev, err := NewEvalSet(src, 256)
	if err != nil {
		return err
	}
	for first := int64(0); first < ev.Len(); first += 64 {
		if err := ev.packed.RowsInto(&b, first); err != nil {
			return err
		}
	}
	fmt.Printf("%d examples, %d tokens, %d rows in 2 epochs\n", src.Stats.Examples, src.Stats.Tokens, rows)
	return nil
}

// writeJSONL writes about sizeBytes of JSONL: text lines of 100-3000
// bytes, prompt/completion lines and, one line in 40, a conversation.
func writeJSONL(t *testing.T, path string, sizeBytes int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	words := strings.Fields("the quick brown fox jumps over a lazy dog while seven engines hum along the river under bright moons and quiet rain")
	var n int64
	for i := 0; n < sizeBytes; i++ {
		var b strings.Builder
		for j := 0; b.Len() < 100+(i*7919)%2900; j++ {
			b.WriteString(words[(i+j*j)%len(words)])
			b.WriteByte(' ')
		}
		var rec any
		switch {
		case i%40 == 0:
			rec = map[string]any{"messages": []any{map[string]string{"role": "user", "content": b.String()[:50]}, map[string]string{"role": "assistant", "content": b.String()[50:]}}}
		case i%3 == 0:
			rec = map[string]string{"prompt": b.String()[:40], "completion": b.String()[40:]}
		default:
			rec = map[string]string{"text": b.String()}
		}
		line, _ := json.Marshal(rec)
		w.Write(line)
		w.WriteByte('\n')
		n += int64(len(line)) + 1
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// childPeak runs dataChild on path and returns its peak RSS: the largest
// VmHWM read from /proc every 10 ms (not getrusage's maxrss, which on Linux
// also counts this process's peak: the child is exec'd from a vfork that
// shares its memory). With bound > 0 it kills the child once its RSS is
// above bound (a memory cap), returning that sample.
func childPeak(t *testing.T, path string, bound int64) int64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	// The child's garbage collector is held to 32 MiB of Go memory: on a
	// loaded machine its lag lets garbage pile up by tens of MiB, which is
	// not what this measures (memory kept past the limit still shows).
	cmd.Env = append(os.Environ(), "STRATA_DATA_CHILD="+path, "STRATA_DATA_DIR="+t.TempDir(), "GOMEMLIMIT=32MiB")
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var over, peak int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if over > 0 {
				return over
			}
			if err != nil {
				t.Fatalf("child on %s: %v\n%s", path, err, stderr.String())
			}
			t.Logf("%s: %s", filepath.Base(path), strings.TrimSpace(out.String()))
			return peak
		case <-tick.C:
			rss, hwm := hosttest.ProcRSS(cmd.Process.Pid)
			peak = max(peak, hwm)
			if bound > 0 && rss > bound && over == 0 {
				over = rss
				cmd.Process.Kill()
			}
		}
	}
}

// TestStreamedMemory: tokenizing a 256 MiB JSONL file into its token file
// and reading every row of two shuffled epochs and of the file as an eval
// set, in a child process capped at the same work on an 8 MiB file plus
// 24 MiB (the larger of two runs; holding a byte per token of the large
// file would be 250 MiB), is done with memory that does not grow with the
// file: its peak
// RSS is within that cap and at most a quarter of the file. Under the race
// detector (shadow memory several times the heap's, code many times
// slower) the large file is 32 MiB and only the cap is checked.
func TestStreamedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes and tokenizes a 256 MiB file in a child process")
	}
	dir := t.TempDir()
	small, large := filepath.Join(dir, "small.jsonl"), filepath.Join(dir, "large.jsonl")
	writeJSONL(t, small, 8<<20)
	largeBytes := int64(256 << 20)
	if raceEnabled {
		largeBytes = 32 << 20
	}
	writeJSONL(t, large, largeBytes)
	const slackBytes = 24 << 20
	base := max(childPeak(t, small, 0), childPeak(t, small, 0))
	bound := base + slackBytes
	peak := childPeak(t, large, bound)
	t.Logf("peak RSS: %.1f MiB on an 8 MiB file, %.1f MiB on a %d MiB file (cap %.1f MiB)", float64(base)/(1<<20), float64(peak)/(1<<20), largeBytes>>20, float64(bound)/(1<<20))
	if peak > bound {
		t.Errorf("peak RSS %d MiB on a %d MiB file, over the cap %d MiB (the 8 MiB file's %d MiB + %d MiB): memory grows with the file", peak>>20, largeBytes>>20, bound>>20, base>>20, slackBytes>>20)
	}
	if !raceEnabled && 4*peak > largeBytes {
		t.Errorf("peak RSS %d MiB is more than a quarter of the %d MiB file", peak>>20, largeBytes>>20)
	}
}
