package cmd

import (
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
	return &cli.App{
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
			benchCommand(),
			exportCommand(),
			inspectCommand(),
			versionCommand(),
		},
	}
}

// Main runs the CLI and returns the process exit status: 0 on success,
// 1 on a failed command, 2 on bad usage.
func Main(args []string) int {
	app := App(os.Stdout, os.Stderr)
	if err := app.Run(args); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		var ec exitCoder
		if errors.As(err, &ec) && ec.ExitCode() != 0 {
			return ec.ExitCode()
		}
		return 1
	}
	return 0
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
	}
	return &cli.Command{
		Name:        "bench",
		Usage:       "measure the machine and the engine: " + commandNames(subs),
		Subcommands: subs,
	}
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
