// Package cmd is the strata command line, a thin shell over the library.
//
// Its commands: train, eval, generate, estimate, plan, bench (nvme, adam,
// gemm, step, comm), export, inspect, plot and version.
// TestDocListsCommands keeps this list equal to the App's commands.
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
// train in a job of several processes (job.go: mpirun -np P strata train
// --devices L) joins Open MPI through package dist: process 0 prints and
// writes the run, the others send it their shards and print only their
// errors, every process stops after the same step and follows process 0's
// verdict on a save; bench comm measures the collectives across processes.
//
// eval and generate (infer.go) open --model as train --init opens its PATH
// (init.go's probeModel and open), hold every parameter resident on one
// device (model.Weights, uploaded a chunk at a time: host memory holds one
// chunk), refuse a model that does not fit with what it needs, and run a
// model.Decoder: eval a window at a time of a file tokenized a block at a
// time, generate the prompt in one step and then a token a step through
// the key/value cache. The tokenizer is the model's tokenizer.json (a
// Strata checkpoint's: its run's recorded source), else the byte
// tokenizer for a vocabulary of 256. eval reads a JSONL file as train's
// --eval-data does (eval_jsonl.go: data.Open and data.EvalSet with the
// same tokenizer and chat template, runChat), each packed example scored
// alone from an empty cache, the loss only on its trained tokens.
//
// estimate's --model is a named shape, a Hugging Face directory or a
// Strata run or checkpoint (estimate_model.go: probeModel, or the run's
// config.json); a --config without strata.model needs it (or --params):
// the config's default model is never estimated silently.
//
// Notes before the work are few (notes.go): the config's keys accepted but
// not used are one line (configNotes), and a progress bar redraws its
// line only on a terminal (isTerminal: stderr a character device); a log
// file or a pipe gets a plain line per steps_per_print.
//
// Flags go anywhere: before, between and after a command's positional
// arguments, as most command lines take them. urfave/cli v2 has no option
// for it (its parser, Go's flag package, stops at the first argument; v1's
// argument reordering is gone from v2), so Run passes the arguments
// through a pre-pass, reorderArgs (args.go), that moves each of the
// command's flags (with its value: `--flag value` or `--flag=value`; a
// bool flag takes none) before its arguments, which follow a `--`; a `--`
// of the user's ends the flags. The same pass refuses an unknown command
// or flag with the nearest name ("did you mean --save-every?", as config
// keys are suggested) and a missing required flag by name, without the
// whole help; onUsageError makes a value that does not parse one line.
// Main prints an error once, as one line with one prefix, "strata CMD: ",
// and without the names of the packages it was wrapped in (errorLine).
// --help shows each flag's default once (help.go: the usage's own words
// when it names one, "from the config", else a value that is not the
// unset zero or a sentinel); --devices means the same in every command
// that reads a config: it decides over strata.devices, whose default is 1.
//
// Exit status: 0 on success, 1 for a failed command, 2 for bad usage
// (usageError: every usage error, the pre-pass's and urfave/cli's too),
// 130 for a run stopped on SIGINT and 143 on SIGTERM (train says at once
// which step it stops after and where it saves; it stops
// after the step in progress and, with --out, saves a checkpoint of it; a
// second signal says what survives, the last complete checkpoint, removes
// the run's swap files' names and ends the process at once; a signal during
// start-up ends it before the first step, closing the engine, which removes
// its swap files; one while the data is tokenized stops the tokenizing
// within a line of JSONL or a MiB of text, interrupts.ctx cancelled).
//
// A save the disk refuses (full, over quota, read-only, an I/O error) does
// not end a run (run/savefail.go): a periodic checkpoint that fails prints one
// warning line naming the cause and the newest complete checkpoint, which
// "latest" keeps naming; training goes on and the next save retries; a
// steps.jsonl line the disk refuses is cut back off and counted; the
// summary says how many saves (and lines) failed. The save of the last
// step, or of a stop on a signal, failing is an error (exit 1; a signal's
// status for a stop) once summary.json and the weights are written: the
// last state is not saved, and the error names the checkpoint that is.
//
// Every checkpoint records the run's training data (run/dataid.go: per file
// its size and a SHA-256, of the whole file up to 1 MiB, else of its
// first, middle and last 64 KiB with the size; the mtime recorded, not
// compared): --resume on data that changed (grew, rewritten, another
// file) is refused in one line naming the file and what changed, unless
// --allow-data-change, which the command that goes on does not repeat.
//
// A run directory (train --out) belongs to one run: strata.lock is
// flock(2)ed while a run writes into it (a second run is refused, naming
// the holder's pid), run.json holds the run's id, which every checkpoint
// it saves records, the source of its weights (train --init: a
// Hugging Face directory and its tokenizer files, init.go) and the flags
// the run was given (givenFlags): the command a stopped run prints to go
// on with it (goOn: --resume DIR --out DIR --steps TOTAL) repeats every
// one of them but those that start a new run and those the checkpoint's
// config holds (--config and the "auto" values); a new run refuses a
// non-empty directory unless --overwrite, and a resumed run
// takes the directory of the run it continues.
package cmd
