// Package run trains a model in a run directory.
//
// A run claims the directory (a lock, run.json), resumes from a checkpoint
// of it after checking that the training data is the one the checkpoint
// recorded, runs the engine's steps, writes one steps.jsonl line per step,
// the config's monitors and the held-out evaluations, saves checkpoints on
// a cadence (the last step's always, the older ones pruned), and ends with
// model.safetensors and summary.json.
//
// Train is the one call; Options says everything the command line's flags
// say, as typed fields. Its config is the one Resolve makes of a
// ConfigRequest: a DeepSpeed-style config file, else the config of the
// checkpoint it resumes (ResolveResume), else the demonstration's, of the
// shape of the model it starts from, with the command line's values
// (--devices, --steps, --lr ...) applied, as `strata train` resolves it. Cancelling Train's context stops the run at the
// next step boundary: the step is saved as a checkpoint (with an Out
// directory), the outputs of that step are written, and Train returns a
// *StoppedError, which matches context.Canceled.
//
// A run directory belongs to one run:
//
//	DIR/strata.lock     flock(2)ed while a run writes into DIR
//	DIR/run.json        the run's id, the source of its weights, its flags
//	DIR/config.json     the resolved config
//	DIR/steps.jsonl     one StepLine per step
//	DIR/checkpoints/    training checkpoints (checkpoint package)
//	DIR/model.safetensors, DIR/summary.json   the outputs of the last step
//
// A save the disk refuses (full, read-only) does not end the run: it is
// warned about on Options.Progress, and the next save retries; only the
// save of the last step (or of a stop) failing is an error, once the
// outputs are written.
//
// The package prints nothing of its own accord: progress lines go to
// Options.Progress and the run's report to Options.Report (both
// io.Discard by default), which is how the strata command line shows them.
package run
