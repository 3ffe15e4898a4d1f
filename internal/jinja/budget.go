package jinja

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
	"unsafe"
)

// The budget of a rendering: a chat template comes inside a downloaded
// model repository, so what it may cost is bounded by the interpreter, not
// by the template. One budget per rendering counts two things, each
// charged before the work it pays for where the size is known beforehand:
//
//   - steps (Limits.Steps, MaxSteps by default): every statement, loop iteration and
//     expression evaluated, every item an operation visits (a comparison,
//     in, join, select, tojson, repr), every scanBytesPerStep bytes a
//     string operation searches (in, find, count, replace, ==, a dict
//     key hashed) and every walkBytesPerStep bytes one walks a character
//     at a time (length, an index);
//   - bytes (Limits.Bytes, MaxBytes by default): every string, list and dict built (a
//     repeat, a concatenation, a filter's or method's result, range, a
//     slice, a literal) and the output, at their size in memory (16 bytes
//     an item of a list), whether or not they are kept.
//
// Bytes are counted as built, not as live, so they bound the rendering's
// memory (and the time spent copying) whatever the template keeps. The
// stop signal (the context of Render) is looked at every stopEverySteps
// steps, so a cancelled rendering ends within a few milliseconds.

// MaxSteps is the default bound of the steps of a rendering (a template
// looping without end is an error, not a hang).
const MaxSteps = 10_000_000

// MaxBytes is the default bound of the bytes a rendering builds, its
// output included (package data renders within four times its largest
// JSONL line instead: data.MaxLineBytes).
const MaxBytes = 256 << 20

// Limits bound one rendering (the budget above); a field of zero is its
// default (MaxSteps, MaxBytes).
type Limits struct {
	Steps int64 // steps
	Bytes int64 // bytes built
}

// maxRange is the most items range() gives: Jinja2's sandbox, in which
// Hugging Face renders chat templates, refuses more (its MAX_RANGE).
const maxRange = 100_000

const (
	// scanBytesPerStep is the bytes a scan of a string (in, find, count)
	// covers in one step: tens of nanoseconds, as a statement takes.
	scanBytesPerStep = 64
	// walkBytesPerStep is the bytes a walk over a string's characters
	// (len, s[i]) covers in one step.
	walkBytesPerStep = 16
	// stopEverySteps is how often the stop signal is looked at.
	stopEverySteps = 1024
	// itemBytes is what an item of a list or tuple takes (an interface
	// value), and an entry of a dict (a key and a value).
	itemBytes      = 16
	dictEntryBytes = 48
)

// ErrBudget is the error of a rendering that went past its budget (steps
// or bytes): the template loops or builds without bound.
var ErrBudget = errors.New("the chat template went past its budget")

// budget is what a rendering has spent and may spend.
type budget struct {
	ctx                context.Context // the stop signal; nil: none
	steps, bytes       int64           // spent
	maxSteps, maxBytes int64
	nextStop           int64 // the step at which ctx is looked at next
	depth              int   // values being visited, one in another (nest)
	macroDepth         int   // macro calls running, one in another (maxMacroDepth)
}

func newBudget(ctx context.Context, lim Limits) *budget {
	b := &budget{ctx: ctx, maxSteps: lim.Steps, maxBytes: lim.Bytes}
	if b.maxSteps == 0 {
		b.maxSteps = MaxSteps
	}
	if b.maxBytes == 0 {
		b.maxBytes = MaxBytes
	}
	return b
}

// step charges n steps.
func (b *budget) step(n int64) error {
	if n < 0 || n > b.maxSteps-b.steps {
		return fmt.Errorf("%w: more than %d steps (statements, loop iterations, expressions, items visited) in one rendering", ErrBudget, b.maxSteps)
	}
	b.steps += n
	if b.steps >= b.nextStop {
		b.nextStop = b.steps + stopEverySteps
		if b.ctx != nil {
			if err := b.ctx.Err(); err != nil {
				return fmt.Errorf("rendering stopped after %d steps: %w", b.steps, err)
			}
		}
	}
	return nil
}

// scan charges a pass over a string of n bytes (a search, a comparison).
func (b *budget) scan(n int) error {
	return b.step(int64(n)/scanBytesPerStep + 1)
}

// walk charges a walk over a string of n bytes a character at a time
// (counting, indexing them).
func (b *budget) walk(n int) error {
	return b.step(int64(n)/walkBytesPerStep + 1)
}

// alloc charges n bytes about to be built.
func (b *budget) alloc(n int64) error {
	if n < 0 || n > b.maxBytes-b.bytes {
		return fmt.Errorf("%w: more than %d bytes (%d MiB) built in one rendering (strings, lists and the output)", ErrBudget, b.maxBytes, b.maxBytes>>20)
	}
	b.bytes += n
	return nil
}

// allocN charges n things of size bytes each (n from the template: any
// int64, the product checked before it is formed).
func (b *budget) allocN(n, size int64) error {
	if n < 0 || size < 0 || (size > 0 && n > (b.maxBytes-b.bytes)/size) {
		return b.alloc(-1)
	}
	return b.alloc(n * size)
}

// items charges a list of n items built.
func (b *budget) items(n int) error {
	return b.allocN(int64(n), itemBytes)
}

// text builds a string within a budget: what is written is charged
// (add), or charged before and then written (reserve, then write*), and
// its buffer grows by doubling, never past what the budget has left, so
// that its allocations come to twice its length at most (a
// strings.Builder grows a large one by a quarter: five times).
type text struct {
	buf []byte
	bud *budget
}

func (t *text) add(s string) error {
	if err := t.bud.alloc(int64(len(s))); err != nil {
		return err
	}
	t.reserve(len(s))
	t.buf = append(t.buf, s...)
	return nil
}

// reserve makes room for n more bytes, already charged: twice the room,
// or all the budget has left when doubling twice would pass it (not
// doubling again to a few bytes more than the last).
func (t *text) reserve(n int) {
	l, c := len(t.buf), cap(t.buf)
	if n <= c-l {
		return
	}
	most := l + n + int(min(t.bud.maxBytes-t.bud.bytes, math.MaxInt32))
	next := 2 * c
	if 2*next > most {
		next = most
	}
	b := make([]byte, l, max(l+n, next))
	copy(b, t.buf)
	t.buf = b
}

func (t *text) writeString(s string) { t.buf = append(t.buf, s...) }
func (t *text) writeByte(c byte)     { t.buf = append(t.buf, c) }
func (t *text) writeRune(r rune)     { t.buf = utf8.AppendRune(t.buf, r) }
func (t *text) Len() int             { return len(t.buf) }

// String returns the text, not copied: t is not written to after.
func (t *text) String() string { return unsafe.String(unsafe.SliceData(t.buf), len(t.buf)) }

// brief is repr(v) cut at a few hundred bytes, for error messages (a
// value in an error is never built whole).
func brief(v any) string {
	const most = 200
	more := ""
	if s, ok := v.(string); ok && len(s) > most {
		cut := most
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		v, more = s[:cut], "..."
	}
	t := &text{bud: &budget{maxSteps: 1000, maxBytes: most + 8}}
	if err := reprTo(t, v); err != nil {
		return t.String() + "..."
	}
	return t.String() + more
}
