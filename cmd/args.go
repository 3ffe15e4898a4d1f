package cmd

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/urfave/cli/v2"
)

// Flags anywhere. urfave/cli v2 parses a command's arguments with Go's
// flag package, which stops at the first positional argument: in
// `strata export --format hf RUN OUT --dtype bf16` the --dtype would be a
// third argument. (v2 has no option for it: v1's argument reordering was
// removed in v2.0 and only v3 parses flags after arguments.) So Run passes
// the arguments through reorderArgs first: the command's words (`bench
// nvme`) stay in front; after them, each of the command's own flags moves
// before its positional arguments, with its value when it takes one
// (`--flag value`, `--flag=value`; a bool flag takes none: `--flag` or
// `--flag=false`), the arguments follow in their order after a `--`, and
// a `--` of the user's ends the flags: what follows it is an argument
// even when it starts with a dash. A lone `-` is an argument.
//
// The same pass refuses, before urfave/cli sees them, an unknown command
// or flag (with the nearest name: "did you mean --save-every?") and a
// missing required flag (naming it, without the whole help), each as one
// line and exit status 2.

// reorderArgs returns args (args[0] the program's name) with every
// command's flags before its positional arguments, or a usage error, and
// the command's words ("bench nvme").
func reorderArgs(app *cli.App, args []string) ([]string, string, error) {
	out, path, err := reorder(app, args)
	return out, strings.TrimPrefix(strings.TrimPrefix(path, "strata"), " "), err
}

func reorder(app *cli.App, args []string) ([]string, string, error) {
	if len(args) < 2 {
		return args, "", nil
	}
	out := []string{args[0]}
	rest := args[1:]
	path := "strata"
	cmds, flags := app.Commands, append(slices.Clone(app.Flags), cli.HelpFlag, cli.VersionFlag)
	for {
		// A group (the app, bench): its flags (bool: --help, --version) up
		// to the command's name.
		i := 0
		for i < len(rest) && strings.HasPrefix(rest[i], "-") && rest[i] != "-" && rest[i] != "--" {
			if _, err := lookupFlag(flags, rest[i], path); err != nil {
				return nil, path, err
			}
			i++
		}
		out = append(out, rest[:i]...)
		rest = rest[i:]
		if len(rest) == 0 || rest[0] == "--" || slices.Contains(out[1:], "--help") || slices.Contains(out[1:], "-h") {
			return append(out, rest...), path, nil
		}
		name := rest[0]
		c := findCommand(cmds, name)
		if c == nil {
			if path == "strata" && (name == "help" || name == "h") {
				return append(out, rest...), path, nil
			}
			return nil, path, usagef("%sunknown command %q%s (see '%s --help')", prefix(path), name, suggest(name, strings.Split(commandNames(cmds), ", "), ""), path)
		}
		out = append(out, name)
		rest = rest[1:]
		path += " " + c.Name
		if len(c.Subcommands) > 0 {
			cmds, flags = c.Subcommands, append(slices.Clone(c.Flags), cli.HelpFlag)
			continue
		}
		out, err := reorderCommand(c, path, out, rest)
		return out, path, err
	}
}

// reorderCommand moves a leaf command's flags before its arguments and
// checks that its required flags are given.
func reorderCommand(c *cli.Command, path string, out, rest []string) ([]string, error) {
	flags := append(slices.Clone(c.Flags), cli.HelpFlag)
	var fl, pos []string
	given := map[string]bool{}
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		f, err := lookupFlag(flags, a, path)
		if err != nil {
			return nil, err
		}
		for _, n := range f.Names() {
			given[n] = true
		}
		fl = append(fl, a)
		if takesValue(f) && !strings.Contains(a, "=") && i+1 < len(rest) {
			fl = append(fl, rest[i+1])
			i++
		}
	}
	if !given["help"] {
		for _, f := range c.Flags {
			if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() && !given[f.Names()[0]] {
				return nil, usagef("%smissing %s%s (see '%s --help')", prefix(path), flagName(f.Names()[0]), placeholderOf(f), path)
			}
		}
	}
	out = append(out, fl...)
	if len(pos) > 0 {
		out = append(append(out, "--"), pos...)
	}
	return out, nil
}

// lookupFlag finds the flag an argument (`--name`, `-n`, `--name=value`)
// names among flags, or says it is unknown with the nearest name.
func lookupFlag(flags []cli.Flag, arg, path string) (cli.Flag, error) {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	var names []string
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f, nil
		}
		names = append(names, f.Names()[0])
	}
	return nil, usagef("%sunknown flag %s%s (see '%s --help')", prefix(path), flagName(name), suggest(name, names, "--"), path)
}

// prefix is the start of a usage error of the command path ("strata
// train"): "train: ", as the commands' own errors start.
func prefix(path string) string {
	if p := strings.TrimPrefix(path, "strata "); p != path {
		return p + ": "
	}
	return ""
}

// takesValue says whether a flag takes a value (not a bool flag).
func takesValue(f cli.Flag) bool {
	if d, ok := f.(cli.DocGenerationFlag); ok {
		return d.TakesValue()
	}
	return true
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// flagName writes a flag's name as the user types it: --name, or -n.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// placeholderOf is " VALUE" for a flag that takes one ("" for a bool
// flag): the word its usage puts in backquotes, else the name's.
func placeholderOf(f cli.Flag) string {
	if !takesValue(f) {
		return ""
	}
	return " " + strings.ToUpper(strings.ReplaceAll(f.Names()[0], "-", "_"))
}

// suggest is "; did you mean PREFIX+NAME?" for the candidate nearest to
// name (as config keys are suggested), or "".
func suggest(name string, candidates []string, prefix string) string {
	near := config.Nearest(name, candidates)
	if near == "" {
		return ""
	}
	if prefix != "" {
		return fmt.Sprintf("; did you mean %s?", flagName(near))
	}
	return fmt.Sprintf("; did you mean %s%s?", prefix, near)
}

var flagParseError = regexp.MustCompile(`^invalid value "(.*)" for flag -+(\S+): (.*)$`)

// onUsageError turns the flag parser's errors (a value that does not
// parse, a flag without its value) into one line and exit status 2,
// without the help that urfave/cli prints with them.
func onUsageError(c *cli.Context, err error, _ bool) error {
	path := "strata"
	if c.Command != nil && c.Command.Name != "" {
		path = strings.TrimSpace(c.Command.HelpName)
	}
	msg := err.Error()
	if m := flagParseError.FindStringSubmatch(msg); m != nil {
		what := "not a valid value"
		if strings.Contains(m[3], "parse error") || strings.Contains(m[3], "invalid syntax") {
			what = "not a number"
		} else if strings.Contains(m[3], "out of range") {
			what = "out of range"
		}
		msg = fmt.Sprintf("%s %q: %s", flagName(m[2]), m[1], what)
	} else if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		msg = fmt.Sprintf("%s needs a value", flagName(strings.TrimLeft(name, "-")))
	}
	return usagef("%s%s (see '%s --help')", prefix(path), msg, path)
}

// setUsageErrors gives every command onUsageError.
func setUsageErrors(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = onUsageError
		setUsageErrors(c.Subcommands)
	}
}
