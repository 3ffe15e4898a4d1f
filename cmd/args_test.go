package cmd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// leafCommands are the App's commands that run (bench's subcommands, not
// bench), each with its words ("bench nvme").
func leafCommands() map[string]*cli.Command {
	out := map[string]*cli.Command{}
	var walk func(prefix string, cmds []*cli.Command)
	walk = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			if len(c.Subcommands) > 0 {
				walk(prefix+c.Name+" ", c.Subcommands)
				continue
			}
			out[prefix+c.Name] = c
		}
	}
	walk("", App(io.Discard, io.Discard).Commands)
	return out
}

// TestFlagsAnywhere: for every command, flags after, between and before
// positional arguments (a value flag in both forms and a bool flag) come
// out of reorderArgs before the arguments, which follow a "--"; a "--" of
// the user's ends the flags.
func TestFlagsAnywhere(t *testing.T) {
	for path, c := range leafCommands() {
		var boolFlag, valueFlag cli.Flag
		for _, f := range c.Flags {
			if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() {
				continue
			}
			if takesValue(f) && valueFlag == nil {
				valueFlag = f
			}
			if !takesValue(f) && boolFlag == nil {
				boolFlag = f
			}
		}
		var required []string
		for _, f := range c.Flags {
			if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() {
				required = append(required, "--"+f.Names()[0], "R")
			}
		}
		words := strings.Fields(path)
		b := "--help"
		if boolFlag != nil {
			b = "--" + boolFlag.Names()[0]
		}
		var in, want []string
		if valueFlag != nil {
			v := "--" + valueFlag.Names()[0]
			in = slices.Concat(words, []string{"A", v, "1", "B", b, v + "=2"}, required, []string{"--", "-C", "--x"})
			want = slices.Concat(words, []string{v, "1", b, v + "=2"}, required, []string{"--", "A", "B", "-C", "--x"})
		} else {
			in = slices.Concat(words, []string{"A", b}, required, []string{"--", "-C"})
			want = slices.Concat(words, []string{b}, required, []string{"--", "A", "-C"})
		}
		got, gotPath, err := reorderArgs(App(io.Discard, io.Discard), append([]string{"strata"}, in...))
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if !slices.Equal(got[1:], want) || gotPath != path {
			t.Errorf("%s: reorderArgs(%q) = %q (%q), want %q", path, in, got[1:], gotPath, want)
		}
	}

	// End to end: the forms of the issue.
	run := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--steps", "2", "--no-progress", "--out", run, "--save-every", "2"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	out, _, err := runApp(t, "inspect", run, "--json")
	if err != nil || !strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Errorf("inspect RUN --json: %v, want JSON:\n%s", err, out)
	}
	hf := filepath.Join(t.TempDir(), "hf")
	if out, _, err := runApp(t, "export", "--format", "hf", run, hf, "--dtype", "bf16"); err != nil || !strings.Contains(out, "bf16") {
		t.Errorf("export --format hf RUN OUT --dtype bf16: %v\n%s", err, out)
	}
	st := filepath.Join(t.TempDir(), "w.safetensors")
	if _, _, err := runApp(t, "export", run, "--names=hf", st); err != nil {
		t.Errorf("export RUN --names=hf OUT: %v", err)
	}
	// After "--", "--json" is a path, not the flag.
	if out, _, err := runApp(t, "inspect", "--", "--json"); err == nil || !strings.Contains(err.Error(), "--json") || out != "" {
		t.Errorf("inspect -- --json: %v (%q), want an error about the path --json", err, out)
	}
	if _, _, err := runApp(t, "export", run, "--", st, "--names", "hf"); err == nil || !strings.Contains(err.Error(), "got 4 arguments") {
		t.Errorf("export RUN -- OUT --names hf: %v, want 4 arguments", err)
	}
}

// TestUsageErrors: each usage error, of any command, is one line that
// names the mistake (with the nearest name for a misspelled one and
// where to read more), prints no help, and exits 2.
func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"train", "--sav-every", "3"}, []string{"train: unknown flag --sav-every; did you mean --save-every?", "see 'strata train --help'"}},
		{[]string{"train", "--steps", "1", "--no-progres"}, []string{"did you mean --no-progress?"}},
		{[]string{"estimate", "--model", "tiny", "--devises", "2"}, []string{"unknown flag --devises; did you mean --devices?"}},
		{[]string{"bench", "nvme", "--pth", "x"}, []string{"bench nvme: unknown flag --pth; did you mean --path?"}},
		{[]string{"export", "--fromat", "hf", "a", "b"}, []string{"did you mean --format?"}},
		{[]string{"trian"}, []string{`unknown command "trian"; did you mean train?`, "see 'strata --help'"}},
		{[]string{"bench", "nvm"}, []string{`bench: unknown command "nvm"; did you mean nvme?`}},
		{[]string{"--verbose"}, []string{"unknown flag --verbose"}},
		{[]string{"eval", "--data", "x"}, []string{"eval: missing --model", "see 'strata eval --help'"}},
		{[]string{"generate", "--model", "x"}, []string{"generate: give the prompt: --prompt TEXT"}},
		{[]string{"bench", "nvme"}, []string{"bench nvme: missing --path"}},
		{[]string{"train", "--steps", "abc"}, []string{`train: --steps "abc": not a number`, "see 'strata train --help'"}},
		{[]string{"train", "--out"}, []string{"train: --out needs a value"}},
		{[]string{"estimate", "--model", "tiny", "--stage", "x"}, []string{`--stage "x"`}},
		{[]string{"train", "extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"export", "a"}, []string{"want CHECKPOINT and OUT"}},
		{[]string{"inspect"}, []string{"want one PATH"}},
		{[]string{"bench", "step", "x"}, []string{`unexpected argument "x"`}},
		{[]string{"estimate", "x"}, []string{`unexpected argument "x"`}},
		{[]string{"train", "--save-every", "2"}, []string{"--save-every needs --out"}},
	}
	for _, c := range cases {
		out, errOut, err := runApp(t, c.args...)
		if err == nil {
			t.Errorf("%q succeeded", c.args)
			continue
		}
		path := ""
		if _, p, _ := reorderArgs(App(io.Discard, io.Discard), append([]string{"strata"}, c.args...)); p != "" {
			path = p
		}
		var buf strings.Builder
		if st := printError(path, err, &buf); st != 2 {
			t.Errorf("%q: exit status %d, want 2 (%v)", c.args, st, err)
		}
		line := buf.String()
		if strings.Count(line, "\n") != 1 || out != "" || errOut != "" {
			t.Errorf("%q: want one line and nothing else, got %q, stdout %q, stderr %q", c.args, line, out, errOut)
		}
		for _, w := range c.want {
			if !strings.Contains(line, w) {
				t.Errorf("%q: %q lacks %q", c.args, line, w)
			}
		}
	}
}

// TestHelpDefaults: every command's --help shows each flag's default at
// most once, no zero value of an unset flag and no sentinel, and --devices
// means the same in train and estimate.
func TestHelpDefaults(t *testing.T) {
	devices := map[string]string{}
	for path, c := range leafCommands() {
		out, _, err := runApp(t, append(strings.Fields(path), "--help")...)
		if err != nil {
			t.Fatalf("%s --help: %v", path, err)
		}
		if !strings.Contains(out, "OPTIONS") && len(c.Flags) > 0 {
			t.Errorf("%s --help lists no options:\n%s", path, out)
		}
		for line := range strings.Lines(out) {
			if n := strings.Count(line, "(default"); n > 1 {
				t.Errorf("%s --help: %d defaults in %q", path, n, line)
			}
			if strings.HasPrefix(strings.TrimSpace(line), "--devices ") {
				_, d, _ := strings.Cut(line, "(default: ")
				devices[path] = d
			}
		}
		// The value shown when the usage names no default: none for a
		// flag left unset (its zero value) and none for a sentinel.
		for _, f := range c.Flags {
			if strings.Contains(f.(cli.DocGenerationFlag).GetUsage(), "default") {
				continue
			}
			line := flagString(f)
			for _, bad := range []string{"(default: 0)", "(default: false)", "(default: -", `(default: "`, "(default: 0s)", "(default: [])"} {
				if strings.Contains(line, bad) {
					t.Errorf("%s --help: %q in %q", path, bad, line)
				}
			}
		}
	}
	for _, p := range []string{"train", "estimate"} {
		if !strings.HasPrefix(devices[p], "from the config, strata.devices") {
			t.Errorf("%s --devices: default %q, want from the config", p, devices[p])
		}
	}
}

// TestErrorLine: the line Main prints has one prefix, "strata CMD: ",
// and the cause, without the names of the packages the error passed
// through.
func TestErrorLine(t *testing.T) {
	cause := &fs.PathError{Op: "stat", Path: "/x", Err: fs.ErrNotExist}
	for _, c := range []struct {
		path string
		err  error
		want string
	}{
		{"train", fmt.Errorf("train: --data: %w", fmt.Errorf("engine: %w", fmt.Errorf("data: %w", cause))), "strata train: --data: stat /x: file does not exist"},
		{"bench nvme", usagef("bench nvme: --bs 0: need a positive size"), "strata bench nvme: --bs 0: need a positive size"},
		{"export", fmt.Errorf("export: checkpoint: %w", cause), "strata export: stat /x: file does not exist"},
		{"", usagef(`unknown command "x"`), `strata: unknown command "x"`},
		{"train", fmt.Errorf("train: config: %w", cause), "strata train: config: stat /x: file does not exist"},
	} {
		if got := errorLine(c.path, c.err); got != c.want {
			t.Errorf("errorLine(%q, %q) = %q, want %q", c.path, c.err, got, c.want)
		}
	}
	_, _, err := runApp(t, "train", "--data", "/does/not/exist", "--steps", "1", "--no-progress")
	if got := errorLine("train", err); err == nil || strings.Count(got, "strata") != 1 || strings.Contains(got, "engine:") || !strings.Contains(got, "/does/not/exist") {
		t.Errorf("train --data of a missing file: %q", got)
	}
}

// TestGoOnRepeatsFlags: the command a run stopped by Ctrl-C prints, run
// as printed, goes on with every flag of the run (the config's from the
// checkpoint): its checkpoints every --save-every steps included.
func TestGoOnRepeatsFlags(t *testing.T) {
	cfg := tinyConfig(t)
	dir := t.TempDir()
	got := make(chan os.Signal, 1)
	signal.Notify(got, os.Interrupt)
	defer signal.Stop(got)
	steps := 0
	testHook = func(p string) error {
		if p == "step" {
			if steps++; steps == 2 {
				syscall.Kill(os.Getpid(), syscall.SIGINT)
				<-got
				time.Sleep(100 * time.Millisecond) // for the watcher to take it
			}
		}
		return nil
	}
	defer func() { testHook = nil }()
	_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "12", "--out", dir, "--save-every", "5", "--keep", "3")...)
	testHook = nil
	var ec exitCoder
	if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 130 {
		t.Fatalf("interrupted run: %v, want exit status 130\n%s", err, stderr)
	}
	line := errorLine("train", err)
	t.Log(line)
	_, cmdline, ok := strings.Cut(line, "go on with: ")
	if !ok {
		t.Fatalf("no command to go on with in %q", line)
	}
	for _, w := range []string{"--resume " + dir, "--out " + dir, "--steps 12", "--save-every 5", "--keep 3", "--data ../testdata/train/corpus.txt", "--no-progress"} {
		if !strings.Contains(cmdline, w) {
			t.Errorf("%q lacks %q", cmdline, w)
		}
	}
	if strings.Contains(cmdline, "--config") { // the checkpoint holds the config it resolved to
		t.Errorf("%q repeats --config", cmdline)
	}
	rf, err := readRunFile(dir)
	if err != nil || rf == nil || !slices.Contains(rf.Args, "--save-every") {
		t.Errorf("run.json: %+v, %v: want the run's flags", rf, err)
	}
	args := strings.Fields(cmdline)
	if args[0] != "strata" {
		t.Fatalf("%q does not start with strata", cmdline)
	}
	if _, stderr, err := runApp(t, args[1:]...); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, stderr)
	}
	for _, name := range []string{"step-00000010", "step-00000012"} {
		if _, err := os.Stat(filepath.Join(dir, "checkpoints", name, "manifest.json")); err != nil {
			t.Errorf("the continued run did not save its --save-every checkpoints: %v", err)
		}
	}
}
