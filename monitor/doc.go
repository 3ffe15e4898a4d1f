// Package monitor writes a run's scalars as DeepSpeed's monitors do.
//
// # What it owns
//
// Two Writers, each taking one step's events (DeepSpeed's (tag, value, x)
// tuples, x being the samples trained so far, DeepSpeed's global_samples):
//
//   - CSV is DeepSpeed's csv_monitor (deepspeed/monitor/csv_monitor.py): one
//     file per tag in one directory, the tag's "/" and " " turned into "_"
//     ("Train/Samples/lr" → Train_Samples_lr.csv), a header row "step,<the
//     tag's last element>", then one row "x,value" per event, the value as
//     Python's repr writes a float (1e-05, 1000000.0, 0.1: FormatPython).
//   - TensorBoard is the event file torch's SummaryWriter writes
//     (tensorboard/summary/writer/event_file_writer.py): a TFRecord file
//     named events.out.tfevents.<secs>.<hostname>.<pid>.<n>, its first
//     Event carrying file_version "brain.Event:2", then one Event per scalar
//     (wall_time, step = x, a Summary of one simple_value), as add_scalar
//     writes them.
//
// # Lifecycle
//
// Open a Writer when the run starts, call WriteEvents once per step with
// the step's events, Close at the end. WriteEvents hands the step to the
// operating system before it returns (no buffering across steps: a crash
// loses at most the step in progress); it does not fsync. A write the disk
// refuses is cut back off (no torn row, no torn record) and returned, so
// the caller can warn and go on: the next step's events follow whole.
//
// A resumed run appends: OpenCSV keeps the rows up to the resumed step and
// drops later ones (a resume from an older checkpoint), writing the header
// only into an empty file; OpenTensorBoard starts a new event file beside
// the old ones, as a new SummaryWriter would, and TensorBoard reads them
// all.
//
// The package knows nothing of the engine or the config: cmd turns a
// step's figures into Events.
package monitor
