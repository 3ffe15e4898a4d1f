// Package curves draws the curves of training runs against the step.
//
// The curves are the loss and eval loss, the learning rate and the NVMe
// bytes of each step.
//
// # Reading
//
// Read takes a run directory written by `strata train --out` and reads its
// steps.jsonl line by line into a Run: one Step per step, the last line of
// each (a resumed run writes again the steps it had run after its last
// checkpoint), in step order. A line cut short at the end of the file (a
// run still writing it) is left out; any other line that does not parse
// is an error naming the file and the line.
//
// # Drawing
//
// Draw writes one figure of panels stacked on one step axis: the loss
// (eval loss dashed, with a dot at each evaluation), the learning rate,
// and, when some run moved bytes to or from NVMe (AnyNVMe), those bytes
// per step of each run that moved any. Each run has one colour of
// Palette, in the order of the runs; the legend, right of the loss panel,
// names each run by its directory. The panels share the height 2:1:1, the
// loss twice the others (2:1 without the NVMe panel). PNG, SVG and PDF
// (FormatOf) are the same figure; an SVG or PDF is sized at 96 pixels an
// inch.
//
// # Memory
//
// A Run holds a few numbers a step (a million steps are 40 MB); lines are
// read one at a time, each at most 1 MiB.
package curves
