package cmd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	trainrun "github.com/strata-ai/strata/run"
)

// orNone is s, or "(none)" for "".
func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// givenFlags are the flags of c's command the user gave, in the order of
// its definitions, as the command takes them: "--name value", "--name"
// for a bool flag set true ("--name=false" false), a repeated flag once a
// value.
func givenFlags(c *cli.Context) []string {
	var args []string
	for _, f := range c.Command.Flags {
		name := f.Names()[0]
		if !c.IsSet(name) {
			continue
		}
		switch v := c.Value(name).(type) {
		case bool:
			if v {
				args = append(args, "--"+name)
			} else {
				args = append(args, "--"+name+"=false")
			}
		case *cli.StringSlice:
			for _, s := range v.Value() {
				args = append(args, "--"+name, s)
			}
		default:
			args = append(args, "--"+name, fmt.Sprint(v))
		}
	}
	return args
}

// notCarried are the flags of a run that the command going on with it
// does not repeat: it resumes (--resume, --out) to the run's total
// (--steps, which --epochs came to); --init and --overwrite start a new
// run; --allow-data-change accepts one change of the data, not the next; and the config is the checkpoint's, the one --config, --lr,
// --micro-batch and --warmup-steps resolved to (as --resume reads it
// without --config: the file may have changed since, and after --init it
// may not name the model, which came from --init).
var notCarried = []string{"--resume", "--out", "--steps", "--epochs", "--init", "--overwrite", "--allow-data-change",
	"--config", "--lr", "--micro-batch", "--warmup-steps"}

// goOn is the command that continues the run of args (givenFlags) in out
// to total steps: `strata train --resume OUT --out OUT --steps TOTAL` and
// every other flag the run was given (--save-every, --keep, --data,
// --eval-data, --devices ...; not those of notCarried), quoted for a POSIX
// shell. With total 0 the run's own --steps or --epochs
// stays.
func goOn(args []string, out string, total int) string {
	cmd := []string{progName, "train", "--resume", out, "--out", out}
	skip := notCarried
	if total > 0 {
		cmd = append(cmd, "--steps", strconv.Itoa(total))
	} else {
		skip = slices.DeleteFunc(slices.Clone(skip), func(s string) bool { return s == "--steps" || s == "--epochs" })
	}
	flags := trainCommand().Flags
	for i := 0; i < len(args); i++ {
		name, _, _ := strings.Cut(args[i], "=")
		f, err := lookupFlag(flags, args[i], "")
		value := err == nil && takesValue(f) && !strings.Contains(args[i], "=") && i+1 < len(args)
		if !slices.Contains(skip, name) {
			cmd = append(cmd, args[i])
			if value {
				cmd = append(cmd, args[i+1])
			}
		}
		if value {
			i++
		}
	}
	for i, a := range cmd {
		cmd[i] = shellQuote(a)
	}
	return strings.Join(cmd, " ")
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// readRunFile reads a run directory's run.json; nil, nil without one.
func readRunFile(dir string) (*trainrun.RunFile, error) { return trainrun.ReadRunFile(dir) }

// formatSummary is a run's summary as text (trainrun.FormatSummary).
var formatSummary = trainrun.FormatSummary

// sameDir reports whether a and b name the same directory.
func sameDir(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// cause is the file operation err failed in ("write PATH: no space left on
// device"), else err.
func cause(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Error()
	}
	return err.Error()
}
