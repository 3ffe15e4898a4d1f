// Package cmd is the strata command line: train, estimate, bench (nvme,
// adam, gemm, step), export, inspect and version. TestDocListsCommands
// keeps this list equal to the App's commands.
//
// It is the only user of the CLI library (urfave/cli) and the only place
// that prints: the libraries return errors, results and counters, and cmd
// decides what to show. Results go to stdout (a table, or one JSON object
// with --json); progress, notes and the devices found go to stderr.
//
// Each command turns its flags into the options struct of the package that
// does the work (config.Config for train, bench.NVMeOptions,
// bench.StepOptions ...), applying defaults only to what the user left
// unset so that an explicit bad value reaches Validate and is refused.
//
// Exit status: 0 on success, 1 for a failed command, 2 for bad usage
// (usageError), 130 for a run stopped on SIGINT or SIGTERM (train stops
// after the step in progress and, with --out, saves a checkpoint of it; a
// second signal ends the process at once).
package cmd
