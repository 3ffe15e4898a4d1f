package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/urfave/cli/v2"
)

// Version is set at link time with -ldflags "-X github.com/strata-ai/strata/cmd.Version=v0.1.0".
var Version = "dev"

// exitCoder lets a command choose its exit status.
type exitCoder interface{ ExitCode() int }

// App builds the CLI application writing to stdout and stderr.
func App(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:  "strata",
		Usage: "train models larger than GPU memory: ZeRO-3 sharding with offload to host RAM and NVMe",
		Description: "Strata shards model state across the local devices (ZeRO stages 0-3) and keeps each shard\n" +
			"in the cheapest tier that keeps the devices busy: HBM, pinned host RAM or NVMe (io_uring, O_DIRECT).",
		Version:   versionString(),
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed once, by Main.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			trainCommand(),
			evalCommand(),
			generateCommand(),
			estimateCommand(),
			planCommand(),
			benchCommand(),
			exportCommand(),
			inspectCommand(),
			plotCommand(),
			versionCommand(),
		},
		OnUsageError: onUsageError,
	}
	setUsageErrors(app.Commands)
	return app
}

// Run runs the CLI on args (args[0] is the program's name) writing to
// stdout and stderr: the arguments pass through reorderArgs (flags
// anywhere, unknown names refused) and then the App.
func Run(args []string, stdout, stderr io.Writer) error {
	_, err := execute(args, stdout, stderr)
	return err
}

// execute is Run, also returning the command's words ("train", "bench
// nvme"; "" before one is known).
func execute(args []string, stdout, stderr io.Writer) (string, error) {
	app := App(stdout, stderr)
	args, path, err := reorderArgs(app, args)
	if err != nil {
		return path, err
	}
	return path, app.Run(args)
}

// Main runs the CLI and returns the process exit status: 0 on success,
// 1 on a failed command, 2 on bad usage. The error is printed once, as
// one line (errorLine).
func Main(args []string) int {
	if len(args) > 0 && args[0] != "" {
		progName = args[0]
	}
	path, err := execute(args, os.Stdout, os.Stderr)
	status := printError(path, err, os.Stderr)
	for _, f := range afterReport {
		f()
	}
	afterReport = nil
	return status
}

// progName is the program as it was run (os.Args[0]: "strata",
// "./strata", a path), in the commands Strata prints for going on.
var progName = "strata"

// afterReport runs after Main has printed the command's error: a job of
// several processes leaves MPI there (MPI_Finalize waits for every
// process), so that process 0's last line is out before its peers, done,
// exit, and mpirun, seeing them gone, ends the job.
var afterReport []func()

// printError prints err (if any) on stderr and returns the exit status.
func printError(path string, err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var je jobError
	if errors.As(err, &je) && je.quiet {
		return je.ExitCode() // process 0 of the job prints it
	}
	fmt.Fprintf(stderr, "%s\n", errorLine(path, err))
	var ie interruptedError
	if errors.As(err, &ie) && ie.status == 0 {
		return 0 // a stop that saved (SIGUSR1 in a job): the line says how to go on
	}
	var ec exitCoder
	if errors.As(err, &ec) && ec.ExitCode() != 0 {
		return ec.ExitCode()
	}
	return 1
}

// errorLine is the one line Main prints for an error of the command path
// ("train", "bench nvme", ""): one prefix, "strata train: ", then the
// message without the command's name it starts with and without the names
// of the packages it passed through ("engine: data: "), which say where
// the error was wrapped, not what went wrong: "strata train: --data:
// stat F: no such file or directory".
func errorLine(path string, err error) string {
	msg := err.Error()
	if path != "" {
		msg = strings.TrimPrefix(msg, path+": ")
		if i := strings.IndexByte(path, ' '); i > 0 {
			msg = strings.TrimPrefix(msg, path[i+1:]+": ") // "nvme: " of bench nvme
		}
	}
	segs := strings.Split(msg, ": ")
	kept := segs[:0]
	for i, s := range segs {
		if i == len(segs)-1 || !packageNames[s] {
			kept = append(kept, s)
		}
	}
	msg = strings.Join(kept, ": ")
	if path == "" {
		return "strata: " + msg
	}
	return "strata " + path + ": " + msg
}

// packageNames are the names of Strata's packages, which begin the
// messages of their errors.
var packageNames = map[string]bool{}

func init() {
	for _, n := range strings.Fields("bench checkpoint cpuadam curves data engine estimate gpu cpu cuda backend hf model nvme pinned prefetch safetensors shard tier timeline tokenizer adam bf16 dtype durable flock units") {
		packageNames[n] = true
	}
}

func versionString() string {
	v := Version
	if info, ok := debug.ReadBuildInfo(); ok && v == "dev" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v = "dev-" + s.Value[:12]
			}
		}
	}
	return v
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version, Go toolchain and platform",
		Action: func(c *cli.Context) error {
			fmt.Fprintf(c.App.Writer, "strata %s (%s, %s/%s)\n", versionString(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}

func benchCommand() *cli.Command {
	subs := []*cli.Command{
		benchNVMeCommand(),
		benchAdamCommand(),
		benchGemmCommand(),
		benchStepCommand(),
		benchCommCommand(),
	}
	return &cli.Command{
		Name:        "bench",
		Usage:       "measure the machine and the engine: " + commandNames(subs),
		Subcommands: subs,
	}
}

// printResult prints a bench workload's result: one JSON object on one
// line with --json, else its table (its String method).
func printResult(w io.Writer, asJSON bool, res any) error {
	if !asJSON {
		_, err := fmt.Fprint(w, res)
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// commandNames lists the commands' names, comma-separated: the help text
// names each one there is, and only those.
func commandNames(cmds []*cli.Command) string {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}

// usageError is a bad-input error: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }
func (e usageError) ExitCode() int { return 2 }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }
