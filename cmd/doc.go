// Package cmd is the strata command line: train, eval, generate, estimate,
// bench (nvme, adam, gemm, step), export, inspect and version.
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
// eval and generate (infer.go) open --model as train --init opens its PATH
// (init.go's probeModel and open), hold every parameter resident on one
// device (model.Weights, uploaded a chunk at a time: host memory holds one
// chunk), refuse a model that does not fit with what it needs, and run a
// model.Decoder: eval a window at a time of a file tokenized a block at a
// time, generate the prompt in one step and then a token a step through
// the key/value cache. The tokenizer is the model's tokenizer.json (a
// Strata checkpoint's: its run's recorded source), else the byte
// tokenizer for a vocabulary of 256.
//
// Exit status: 0 on success, 1 for a failed command, 2 for bad usage
// (usageError), 130 for a run stopped on SIGINT and 143 on SIGTERM (train
// says at once which step it stops after and where it saves; it stops
// after the step in progress and, with --out, saves a checkpoint of it; a
// second signal says what survives, the last complete checkpoint, removes
// the run's swap files' names and ends the process at once; a signal during
// start-up ends it before the first step, closing the engine, which removes
// its swap files).
//
// A run directory (train --out) belongs to one run: strata.lock is
// flock(2)ed while a run writes into it (a second run is refused, naming
// the holder's pid), run.json holds the run's id, which every checkpoint
// it saves records, and the source of its weights (train --init: a
// Hugging Face directory and its tokenizer files, init.go); a new run
// refuses a non-empty directory unless --overwrite, and a resumed run
// takes the directory of the run it continues.
package cmd
