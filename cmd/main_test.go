package cmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/gpu/cuda"
)

// run executes the CLI in-process and returns stdout, stderr and the error.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := Run(append([]string{"strata"}, args...), &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestHelpListsCommands: `strata --help` lists every command of the App,
// and `strata bench --help` (and the bench command's one-line usage) every
// bench subcommand.
func TestHelpListsCommands(t *testing.T) {
	app := App(io.Discard, io.Discard)
	if len(app.Commands) < 6 {
		t.Fatalf("App has %d commands: %v", len(app.Commands), commandNames(app.Commands))
	}
	out, _, err := run(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range app.Commands {
		if !listsCommand(out, c) {
			t.Errorf("--help does not list %q with its usage:\n%s", c.Name, out)
		}
	}
	bench := app.Command("bench")
	if bench == nil || len(bench.Subcommands) == 0 {
		t.Fatal("no bench command with subcommands")
	}
	out, _, err = run(t, "bench", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range bench.Subcommands {
		if !listsCommand(out, c) {
			t.Errorf("bench --help does not list %q with its usage:\n%s", c.Name, out)
		}
		if !slices.Contains(words(bench.Usage), c.Name) {
			t.Errorf("bench's usage %q does not name %q", bench.Usage, c.Name)
		}
	}
}

// listsCommand says whether a help text has c's line: its name, then its
// usage.
func listsCommand(help string, c *cli.Command) bool {
	for line := range strings.Lines(help) {
		if f := strings.Fields(line); len(f) > 0 && strings.TrimSuffix(f[0], ",") == c.Name && strings.Contains(line, c.Usage) {
			return true
		}
	}
	return false
}

// words splits s into its words (runs of letters).
func words(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) })
}

// TestDocListsCommands: the package doc (doc.go) names every command of
// the App and every bench subcommand.
func TestDocListsCommands(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil {
		t.Fatal("doc.go has no package doc")
	}
	doc := f.Doc.Text()
	app := App(io.Discard, io.Discard)
	cmds := slices.Clone(app.Commands)
	cmds = append(cmds, app.Command("bench").Subcommands...)
	for _, c := range cmds {
		if !slices.Contains(words(doc), c.Name) {
			t.Errorf("the package doc does not name the command %q:\n%s", c.Name, doc)
		}
	}
}

func TestVersion(t *testing.T) {
	out, _, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "strata ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version: %q, %v", out, err)
	}
}

func TestEstimateMatchesReferenceText(t *testing.T) {
	// zero-stages-explained.txt: Ψ = 7.5B, N = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device.
	out, _, err := run(t, "estimate", "--params", "7.5B", "--devices", "64", "--align", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Stages []map[string]any `json:"stages"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("estimate --json printed %q: %v", out, err)
	}
	rows := doc.Stages
	if len(rows) != 4 {
		t.Fatalf("estimate --json: %d rows, want 4 stages:\n%s", len(rows), out)
	}
	want := []float64{120e9, 31.4e9, 16.6e9, 1.9e9}
	for i, row := range rows {
		got, ok := findNumber(row, "device_bytes")
		if !ok {
			t.Fatalf("row %d has no device_bytes: %v", i, row)
		}
		if d := got/want[i] - 1; d > 0.02 || d < -0.02 {
			t.Errorf("stage %d: %g bytes per device, reference text says %g", i, got, want[i])
		}
	}
}

func findNumber(m map[string]any, key string) (float64, bool) {
	if v, ok := m[key].(float64); ok {
		return v, true
	}
	for _, v := range m {
		if sub, ok := v.(map[string]any); ok {
			if f, ok := findNumber(sub, key); ok {
				return f, true
			}
		}
	}
	return 0, false
}

func TestEstimateBadInput(t *testing.T) {
	cases := [][]string{
		{"estimate", "--model", "gpt9"},
		{"estimate", "--params", "lots"},
		{"estimate", "--model", "gpt2", "--stage", "5"},
		{"estimate", "--config", "../testdata/configs/bad_misspelled_key.json"},
		{"estimate", "--config", "does-not-exist.json"},
		{"estimate", "--model", "gpt2", "--master", "bf16"},
		{"estimate", "--model", "gpt2", "--master", "bf16+remainder"}, // the optimizer on the device
	}
	for _, args := range cases {
		_, _, err := run(t, args...)
		if err == nil {
			t.Errorf("%v succeeded", args)
			continue
		}
		if msg := err.Error(); len(msg) < 10 || strings.Contains(msg, "panic") {
			t.Errorf("%v: unhelpful error %q", args, msg)
		}
	}
}

func TestUsageErrorExitCode(t *testing.T) {
	var ec exitCoder
	if !errors.As(usagef("x"), &ec) || ec.ExitCode() != 2 {
		t.Fatal("usage errors must exit 2")
	}
}

func TestBenchNVMeBadInput(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args []string
		want string // a piece of the message
		code int    // exit status through exitCoder; 0 means "any failure"
	}{
		{[]string{"bench", "nvme", "--path", dir, "--bs", "0"}, "bs", 2},
		{[]string{"bench", "nvme", "--path", dir, "--qd", "-1"}, "qd", 2},
		{[]string{"bench", "nvme", "--path", dir, "--loops", "3", "--duration", "1s"}, "duration", 2},
		{[]string{"bench", "nvme", "--path", dir + "/does-not-exist", "--size", "1M"}, "does not exist", 0},
		{[]string{"bench", "nvme", "--path", "/dev/shm", "--size", "1M"}, "O_DIRECT", 0},
		{[]string{"bench", "nvme", "--path", dir, "--bs", "1000", "--size", "1000000"}, "alignment", 0},
		{[]string{"bench", "nvme", "--path", dir, "--size", "100000G"}, "free", 0},
		{[]string{"bench", "adam", "--params", "0"}, "params", 2},
		{[]string{"bench", "adam", "--master", "bf16+remainder"}, "--bf16-out", 2},
		{[]string{"bench", "adam", "--master", "bf16"}, "--master", 2},
	}
	for _, c := range cases {
		_, _, err := run(t, c.args...)
		if err == nil {
			t.Errorf("%v succeeded", c.args)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %q does not mention %q", c.args, err, c.want)
		}
		var ec exitCoder
		if c.code != 0 && (!errors.As(err, &ec) || ec.ExitCode() != c.code) {
			t.Errorf("%v: error %q is not exit status %d", c.args, err, c.code)
		}
	}
}

func TestBackendFlag(t *testing.T) {
	for _, args := range [][]string{
		{"train", "--backend", "rocm", "--steps", "1"},
		{"bench", "step", "--backend", "rocm", "--model", "tiny", "--seq", "64"},
	} {
		_, _, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), `"rocm"`) || !strings.Contains(err.Error(), "cuda") {
			t.Errorf("%v: error %v, want one naming the backend and the choices", args, err)
		}
	}
	// Without an NVIDIA driver, --backend cuda says so and how to point at one.
	if _, err := cuda.Probe(); err != nil {
		_, _, err := run(t, "train", "--backend", "cuda", "--steps", "1", "--no-progress")
		if err == nil || !strings.Contains(err.Error(), "STRATA_CUDA_LIB_DIR") {
			t.Errorf("train --backend cuda without a driver: %v, want the driver error with STRATA_CUDA_LIB_DIR", err)
		}
	}
}

// TestTraceFlag: --trace writes a timeline that parses as Chrome trace
// events and says how much transfer time was exposed.
func TestTraceFlag(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		file string
	}{
		{[]string{"train", "--steps", "2", "--no-progress"}, "train.json"},
		{[]string{"bench", "step", "--model", "tiny", "--seq", "64", "--steps", "2", "--warmup", "1", "--modes", "nvme", "--nvme-path", dir, "--probe-size", "64MiB"}, "step.json"},
	} {
		path := dir + "/" + c.file
		out, _, err := run(t, append(c.args, "--trace", path)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if !strings.Contains(out, "exposed transfer time") {
			t.Errorf("%v: no exposed transfer time in the output:\n%s", c.args, out)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var tr struct {
			TraceEvents []struct {
				Name string `json:"name"`
				Ph   string `json:"ph"`
			} `json:"traceEvents"`
		}
		if err := json.Unmarshal(b, &tr); err != nil {
			t.Fatalf("%v: the timeline does not parse: %v", c.args, err)
		}
		spans := 0
		for _, e := range tr.TraceEvents {
			if e.Ph == "X" {
				spans++
			}
		}
		if spans == 0 {
			t.Errorf("%v: %d events, no spans", c.args, len(tr.TraceEvents))
		}
	}
	if _, _, err := run(t, "train", "--steps", "1", "--no-progress", "--trace", dir+"/no/such/dir/t.json"); err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("an unwritable --trace path: %v, want an error naming --trace", err)
	}
	// bench step --json carries the traced mode's figures; an unwritable
	// path fails before the run.
	step := []string{"bench", "step", "--model", "tiny", "--seq", "64", "--steps", "2", "--warmup", "1", "--modes", "host"}
	out, _, err := run(t, append(step, "--json", "--trace", dir+"/step-json.json")...)
	var res struct {
		Trace *struct {
			Mode  string `json:"mode"`
			Steps int    `json:"measured_steps"`
		} `json:"trace"`
	}
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Trace == nil || res.Trace.Mode != "host" || res.Trace.Steps != 2 {
		t.Errorf("bench step --json --trace: %v: %s, want a trace object for the 2 measured steps of host mode", err, out)
	}
	if _, _, err := run(t, append(step, "--trace", dir+"/no/such/dir/t.json")...); err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("bench step, an unwritable --trace path: %v, want an error naming --trace", err)
	}
	// An engine that cannot be built (16 KiB of device memory) leaves no
	// empty timeline behind.
	cfg := dir + "/small-hbm.json"
	if err := os.WriteFile(cfg, []byte(`{"train_micro_batch_size_per_gpu": 1, "strata": {"model": "tiny", "hbm_bytes": 16384}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(t, "train", "--config", cfg, "--steps", "1", "--no-progress", "--trace", dir+"/failed.json"); err == nil {
		t.Error("an engine in 16 KiB of device memory was built")
	}
	if _, err := os.Stat(dir + "/failed.json"); !os.IsNotExist(err) {
		t.Errorf("the timeline of a run whose engine was not built: %v, want no file", err)
	}
}
