package monitor

import (
	"math"
	"strconv"
	"strings"
)

// Event is one scalar of a step: DeepSpeed's (tag, value, x) tuple.
type Event struct {
	Tag   string
	Value float64
	// X is the samples trained so far (DeepSpeed's global_samples): the
	// CSV's step column and the TensorBoard event's step.
	X int64
}

// Writer writes the events of a run, one step at a time.
type Writer interface {
	// WriteEvents writes one step's events and hands them to the
	// operating system. A failed write leaves no partial row or record
	// behind (CSV keeps the rows of the events before the refused one);
	// the error names the file.
	WriteEvents(events []Event) error
	// Path is where the writer writes: the CSV directory, the event file.
	Path() string
	Close() error
}

// FormatPython writes v as Python's repr(float) does (the shortest digits
// that read back to v; positional from 1e-4 up to 1e16, else an exponent
// of at least two digits): 0.1, 1e-05, 1000000.0, 1e+16, nan, -inf. It is
// what Python's csv writer writes for a float, so DeepSpeed's CSV files.
func FormatPython(v float64) string {
	switch {
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	}
	sign := ""
	if math.Signbit(v) {
		sign, v = "-", -v
	}
	// d.ddde±XX: the shortest digits and the exponent.
	e := strconv.FormatFloat(v, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	decpt := x + 1 // digits[:decpt] is the integer part (Python's decpt)
	var b strings.Builder
	b.WriteString(sign)
	switch {
	case decpt <= -4 || decpt > 16: // Python's float_repr_style "short", mode 'r'
		b.WriteString(digits[:1])
		if len(digits) > 1 {
			b.WriteString(".")
			b.WriteString(digits[1:])
		}
		b.WriteString("e")
		if x < 0 {
			b.WriteString("-")
			x = -x
		} else {
			b.WriteString("+")
		}
		if x < 10 {
			b.WriteString("0")
		}
		b.WriteString(strconv.Itoa(x))
	case decpt <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -decpt))
		b.WriteString(digits)
	case decpt >= len(digits):
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", decpt-len(digits)))
		b.WriteString(".0")
	default:
		b.WriteString(digits[:decpt])
		b.WriteString(".")
		b.WriteString(digits[decpt:])
	}
	return b.String()
}

// DeepSpeed's tags (deepspeed/runtime/engine.py and pipe/engine.py), all
// at x = global_samples.
const (
	TrainLoss = "Train/Samples/train_loss"
	LR        = "Train/Samples/lr"
	LossScale = "Train/Samples/loss_scale" // fp16 only
	EvalLoss  = "Train/Samples/eval_loss"  // after an evaluation
)
