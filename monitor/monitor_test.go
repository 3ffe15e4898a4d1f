package monitor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// python is Debian's interpreter: the oracles below use its standard
// library alone (the csv module, repr, struct).
const python = "/usr/bin/python3"

func needPython(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s: %v (the oracles of these tests run on Debian's python3, standard library only)", python, err)
	}
}

func TestFormatPython(t *testing.T) {
	for v, want := range map[float64]string{
		0.1: "0.1", 1e-05: "1e-05", 1e-4: "0.0001", 1000000.0: "1000000.0", 1e16: "1e+16", 1e15: "1000000000000000.0",
		9999999999999998: "9999999999999998.0", 123456789012345680: "1.2345678901234568e+17", 1.5e-07: "1.5e-07",
		0: "0.0", 65536: "65536.0", 2.5: "2.5", -3e-300: "-3e-300", 1e100: "1e+100", 5e-324: "5e-324",
		math.MaxFloat64: "1.7976931348623157e+308", math.Inf(1): "inf", math.Inf(-1): "-inf", 0.00012345: "0.00012345",
	} {
		if got := FormatPython(v); got != want {
			t.Errorf("FormatPython(%g) = %q, want %q", v, got, want)
		}
	}
	if got := FormatPython(math.Copysign(0, -1)); got != "-0.0" {
		t.Errorf("FormatPython(-0) = %q, want -0.0", got)
	}
	if got := FormatPython(math.NaN()); got != "nan" {
		t.Errorf("FormatPython(NaN) = %q, want nan", got)
	}
}

// TestFormatPythonOracle compares FormatPython with Python's repr on
// random bit patterns and on values around every power of ten.
func TestFormatPythonOracle(t *testing.T) {
	needPython(t)
	r := rand.New(rand.NewPCG(1, 2))
	var vs []float64
	for range 3000 {
		vs = append(vs, math.Float64frombits(r.Uint64()))
	}
	for e := -330; e <= 310; e++ {
		p := math.Pow(10, float64(e))
		vs = append(vs, p, math.Nextafter(p, 0), math.Nextafter(p, math.Inf(1)), 1.5*p, -p)
	}
	for range 1000 { // losses, rates, scales: the values a run writes
		vs = append(vs, r.Float64()*10, float64(float32(r.Float64()*1e-3)), math.Ldexp(1, r.IntN(64)))
	}
	var in strings.Builder
	for _, v := range vs {
		in.WriteString(strconv.FormatFloat(v, 'x', -1, 64) + "\n")
	}
	cmd := exec.Command(python, "-c", "import sys\nfor l in sys.stdin: print(repr(float.fromhex(l.strip())))")
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python repr: %v", err)
	}
	want := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(want) != len(vs) {
		t.Fatalf("python printed %d lines for %d values", len(want), len(vs))
	}
	bad := 0
	for i, v := range vs {
		if got := FormatPython(v); got != want[i] && bad < 10 {
			t.Errorf("FormatPython(%x) = %q, Python's repr %q", v, got, want[i])
			bad++
		}
	}
}

// steps are a run's events: DeepSpeed's tags, an fp16 scale, an
// evaluation every third step, a Strata tag with a space (as DeepSpeed
// names files of such tags).
func steps(n int, from int) [][]Event {
	var out [][]Event
	for s := from; s < from+n; s++ {
		x := int64(s) * 32
		es := []Event{{TrainLoss, 10 / float64(s+1), x}, {LR, 1e-5 * float64(s), x}, {LossScale, math.Ldexp(1, 16-s%3), x},
			{"Strata/step time", 0.1 + float64(s)/7, x}, {"Strata/bytes_host_to_nvme", 1e6 * float64(s), x}}
		if s%3 == 0 {
			es = append(es, Event{EvalLoss, 3.25 / float64(s), x})
		}
		out = append(out, es)
	}
	return out
}

// readTree returns every file under dir with its contents.
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		tree[e.Name()] = string(b)
	}
	return tree
}

// TestCSVLikeDeepSpeed writes the same events with CSV and with
// DeepSpeed's csvMonitor restated in Python (testdata/ds_csv.py): the
// directories must hold the same files, byte for byte.
func TestCSVLikeDeepSpeed(t *testing.T) {
	needPython(t)
	run := steps(7, 1)
	goDir, pyDir := filepath.Join(t.TempDir(), "DeepSpeedJobName"), filepath.Join(t.TempDir(), "DeepSpeedJobName")
	c, err := OpenCSV(goDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	for _, es := range run {
		if err := c.WriteEvents(es); err != nil {
			t.Fatal(err)
		}
		var line []map[string]any
		for _, e := range es {
			line = append(line, map[string]any{"tag": e.Tag, "value": strconv.FormatFloat(e.Value, 'x', -1, 64), "x": e.X})
		}
		b, _ := json.Marshal(line)
		in.Write(append(b, '\n'))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "testdata/ds_csv.py", pyDir)
	cmd.Stdin = &in
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testdata/ds_csv.py: %v\n%s", err, out)
	}
	got, want := readTree(t, goDir), readTree(t, pyDir)
	names := []string{"Strata_bytes_host_to_nvme.csv", "Strata_step_time.csv", "Train_Samples_eval_loss.csv",
		"Train_Samples_loss_scale.csv", "Train_Samples_lr.csv", "Train_Samples_train_loss.csv"}
	if k := slices.Sorted(maps.Keys(want)); !slices.Equal(k, names) {
		t.Fatalf("DeepSpeed's files %v, want %v", k, names)
	}
	for _, n := range names {
		if got[n] != want[n] {
			t.Errorf("%s:\n got %q\nwant %q (DeepSpeed's)", n, got[n], want[n])
		}
	}
	if len(got) != len(want) {
		t.Errorf("files %v, DeepSpeed's %v", slices.Sorted(maps.Keys(got)), names)
	}
	// The layout, spelled out: a header of the tag's last element, rows of
	// x and Python's repr, "\r\n" line ends.
	if lr := got["Train_Samples_lr.csv"]; !strings.HasPrefix(lr, "step,lr\r\n32,1e-05\r\n64,2e-05\r\n") {
		t.Errorf("Train_Samples_lr.csv begins %q", lr[:min(len(lr), 40)])
	}
}

// TestCSVResume: a resumed run appends after the resumed step, dropping
// the rows of later steps and a row cut short, with one header.
func TestCSVResume(t *testing.T) {
	dir := t.TempDir()
	write := func(resumeX int64, run [][]Event) {
		t.Helper()
		c, err := OpenCSV(dir, resumeX)
		if err != nil {
			t.Fatal(err)
		}
		for _, es := range run {
			if err := c.WriteEvents(es); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(0, steps(6, 1))
	// A crash in the middle of a row.
	f, err := os.OpenFile(filepath.Join(dir, "Train_Samples_lr.csv"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("224,7e-0")
	f.Close()
	write(4*32, steps(4, 5)) // resumed after step 4: steps 5-8
	b, err := os.ReadFile(filepath.Join(dir, "Train_Samples_lr.csv"))
	if err != nil {
		t.Fatal(err)
	}
	want := "step,lr\r\n"
	for s := 1; s <= 8; s++ {
		want += strconv.Itoa(32*s) + "," + FormatPython(1e-5*float64(s)) + "\r\n"
	}
	if string(b) != want {
		t.Errorf("Train_Samples_lr.csv after a resume from step 4:\n got %q\nwant %q", b, want)
	}
	// A new run (resumeX 0) appends, as DeepSpeed: nothing is dropped but
	// a row cut short.
	f, err = os.OpenFile(filepath.Join(dir, "Train_Samples_lr.csv"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("288,9")
	f.Close()
	write(0, steps(1, 1))
	b2, _ := os.ReadFile(filepath.Join(dir, "Train_Samples_lr.csv"))
	if want2 := want + "32,1e-05\r\n"; string(b2) != want2 {
		t.Errorf("a new run into the directory: got %q, want %q", b2, want2)
	}
}

// record is one line of testdata/read_tfevents.py.
type record struct {
	File        string   `json:"file"`
	FileVersion string   `json:"file_version"`
	Tag         string   `json:"tag"`
	Step        int64    `json:"step"`
	Value       *float64 `json:"value"`
	WallTime    float64  `json:"wall_time"`
}

// readEvents runs the independent reader on the files; its error output
// comes back with a failure.
func readEvents(files ...string) ([]record, string, error) {
	cmd := exec.Command(python, append([]string{"testdata/read_tfevents.py"}, files...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, stderr.String(), err
	}
	var recs []record
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, "", err
		}
		recs = append(recs, r)
	}
	return recs, "", nil
}

// checkEvents says whether recs are a version event and then run's
// events, in order, values rounded to float32 (simple_value).
func checkEvents(t *testing.T, recs []record, run [][]Event) {
	t.Helper()
	if len(recs) == 0 || recs[0].FileVersion != "brain.Event:2" {
		t.Fatalf("the first event is %+v, want file_version brain.Event:2", recs[:min(1, len(recs))])
	}
	var want []Event
	for _, es := range run {
		want = append(want, es...)
	}
	got := recs[1:]
	if len(got) != len(want) {
		t.Fatalf("read %d scalars, wrote %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Tag != w.Tag || g.Step != w.X || g.Value == nil || *g.Value != float64(float32(w.Value)) {
			t.Errorf("scalar %d: read %s step %d value %v, wrote %s x %d value %v", i, g.Tag, g.Step, g.Value, w.Tag, w.X, float32(w.Value))
		}
	}
}

// TestTensorBoardPython writes an event file and reads it back with the
// standard-library reader (testdata/read_tfevents.py: CRC-32C and protocol
// buffers by hand); a corrupted byte anywhere in a record is caught.
func TestTensorBoardPython(t *testing.T) {
	needPython(t)
	dir := filepath.Join(t.TempDir(), "DeepSpeedJobName")
	// A clock before 2001: the seconds are zero-padded to 10 digits.
	tb, err := openTensorBoard(dir, func() time.Time { return time.Unix(987654321, 250_000_000) })
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	name := filepath.Base(tb.Path())
	prefix := fmt.Sprintf("events.out.tfevents.0987654321.%s.%d.", host, os.Getpid())
	if n, err := strconv.Atoi(strings.TrimPrefix(name, prefix)); !strings.HasPrefix(name, prefix) || err != nil || n < 0 {
		t.Errorf("event file %s, want %s<n>", name, prefix)
	}
	run := steps(5, 1)
	for i, es := range run {
		if err := tb.WriteEvents(es); err != nil {
			t.Fatal(err)
		}
		// Each step is in the file before WriteEvents returns.
		recs, msg, err := readEvents(tb.Path())
		if err != nil {
			t.Fatalf("after step %d: %v: %s", i+1, err, msg)
		}
		checkEvents(t, recs, run[:i+1])
		for _, r := range recs {
			if r.WallTime != 987654321.25 {
				t.Fatalf("wall_time %v, want the clock's 987654321.25", r.WallTime)
			}
		}
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(tb.Path())
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "events.out.tfevents.bad")
	// Bytes in the first record's length, its CRC, the version string, the
	// last scalar's value and the file's last CRC.
	for _, off := range []int{0, 9, 20, len(good) - 6, len(good) - 1} {
		b := bytes.Clone(good)
		b[off] ^= 0x10
		if err := os.WriteFile(bad, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, msg, err := readEvents(bad); err == nil || !strings.Contains(msg, "crc mismatch") {
			t.Errorf("byte %d of %d flipped: the reader said %v %q, want a crc mismatch", off, len(good), err, msg)
		}
	}
}

// TestTensorBoardResume: a second writer in the same directory (a resumed
// run) starts a new file; both read back whole.
func TestTensorBoardResume(t *testing.T) {
	needPython(t)
	dir := t.TempDir()
	var files []string
	runs := [][][]Event{steps(3, 1), steps(2, 4)}
	for _, run := range runs {
		tb, err := OpenTensorBoard(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, es := range run {
			if err := tb.WriteEvents(es); err != nil {
				t.Fatal(err)
			}
		}
		tb.Close()
		files = append(files, tb.Path())
	}
	if files[0] == files[1] {
		t.Fatalf("both runs wrote %s", files[0])
	}
	for i, f := range files {
		recs, msg, err := readEvents(f)
		if err != nil {
			t.Fatalf("%s: %v: %s", f, err, msg)
		}
		checkEvents(t, recs, runs[i])
	}
}

// FuzzFormatPython: every float64's text reads back to the same bits,
// in Python's shape (a "." or an exponent, so Python reads a float).
func FuzzFormatPython(f *testing.F) {
	for _, v := range []float64{0, 0.1, 1e-05, 1e16, 1e15, 5e-324, math.MaxFloat64, math.Inf(-1)} {
		f.Add(math.Float64bits(v))
	}
	f.Fuzz(func(t *testing.T, bits uint64) {
		v := math.Float64frombits(bits)
		s := FormatPython(v)
		back, err := strconv.ParseFloat(s, 64)
		if math.IsNaN(v) {
			if s != "nan" {
				t.Fatalf("NaN as %q", s)
			}
			return
		}
		if err != nil || math.Float64bits(back) != bits {
			t.Fatalf("%x as %q reads back as %x (%v)", v, s, back, err)
		}
		if !math.IsInf(v, 0) && !strings.ContainsAny(s, ".e") {
			t.Fatalf("%x as %q: neither a point nor an exponent", v, s)
		}
	})
}
