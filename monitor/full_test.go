package monitor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestFullDisk: on a filesystem that fills up after step 1 and is freed
// after step 2, step 2's write fails with ENOSPC and leaves nothing behind
// (no torn record, no torn row), and step 3 follows step 1 whole.
func TestFullDisk(t *testing.T) {
	needPython(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	tb, err := OpenTensorBoard(filepath.Join(dir, "tb"))
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	// A file whose next row crosses a page: the full filesystem takes its
	// first bytes and refuses the rest.
	os.Mkdir(filepath.Join(dir, "csv"), 0o755)
	edge := filepath.Join(dir, "csv", "C_edge.csv")
	edgeRows := "step,edge\r\n" + strings.Repeat("0,0.0\r\n", 583)
	if err := os.WriteFile(edge, []byte(edgeRows), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCSV(filepath.Join(dir, "csv"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Steps of many events: the event file's step spans pages, so a full
	// filesystem refuses it part way; step 2 opens new CSV files.
	step := func(s int, prefix string) []Event {
		var es []Event
		for i := range 200 {
			es = append(es, Event{fmt.Sprintf("%s/tag_%03d", prefix, i), float64(s*1000 + i), int64(s) * 8})
		}
		return es
	}
	run := [][]Event{step(1, "A"), append([]Event{{"C/edge", 2000, 16}}, step(2, "B")...), append([]Event{{"C/edge", 3000, 24}}, step(3, "A")...)}
	for _, w := range []Writer{tb, c} {
		if err := w.WriteEvents(run[0]); err != nil {
			t.Fatal(err)
		}
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for b := make([]byte, 4096); err == nil; {
		_, err = f.Write(b)
	}
	f.Close()
	tbSize := fileSize(t, tb.Path())
	for _, w := range []Writer{c, tb} {
		err := w.WriteEvents(run[1])
		var pe *os.PathError
		if !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &pe) || !strings.Contains(err.Error(), w.Path()) {
			t.Errorf("%s on a full disk: %v, want ENOSPC naming the file", w.Path(), err)
		}
	}
	if n := fileSize(t, tb.Path()); n != tbSize {
		t.Errorf("the event file is %d bytes after the refused step, %d before", n, tbSize)
	}
	if n := fileSize(t, edge); n != int64(len(edgeRows)) {
		t.Errorf("C_edge.csv is %d bytes after the refused step, %d before", n, len(edgeRows))
	}
	os.Remove(filler)
	for _, w := range []Writer{tb, c} {
		if err := w.WriteEvents(run[2]); err != nil {
			t.Fatal(err)
		}
	}
	recs, msg, err := readEvents(tb.Path())
	if err != nil {
		t.Fatalf("%v: %s", err, msg)
	}
	checkEvents(t, recs, [][]Event{run[0], run[2]})
	b, err := os.ReadFile(filepath.Join(dir, "csv", "A_tag_007.csv"))
	if want := "step,tag_007\r\n8,1007.0\r\n24,3007.0\r\n"; string(b) != want || err != nil {
		t.Errorf("A_tag_007.csv: %q, %v; want %q", b, err, want)
	}
	if b, _ := os.ReadFile(edge); string(b) != edgeRows+"24,3000.0\r\n" {
		t.Errorf("C_edge.csv ends %q, want the step after the refused one to follow its rows", b[max(0, len(b)-30):])
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "csv"))
	for _, e := range ents {
		if info, _ := e.Info(); strings.HasPrefix(e.Name(), "B_") && info.Size() != 0 {
			t.Errorf("%s holds %d bytes of the refused step", e.Name(), info.Size())
		}
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}
