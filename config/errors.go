package config

import (
	"fmt"
	"sort"
	"strings"
)

// Error is one problem in a config: where it is and why it is wrong.
type Error struct {
	File      string // file name as given to Parse; may be empty
	Line, Col int    // 1-based; 0 when the problem has no single position
	Path      string // JSON path of the value, e.g. "zero_optimization.stage"
	Msg       string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d:%d", e.Line, e.Col)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d column %d: ", e.Line, e.Col)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one config, in document order.
type Errors []*Error

func (es Errors) Error() string {
	if len(es) == 1 {
		return es[0].Error()
	}
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return fmt.Sprintf("%d problems:\n%s", len(es), strings.Join(lines, "\n"))
}

// Unwrap lets errors.As find each *Error.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

func sortErrors(es []*Error) {
	sort.SliceStable(es, func(i, j int) bool {
		if es[i].Line != es[j].Line {
			// problems without a position (cross-key checks) come last
			if es[i].Line == 0 || es[j].Line == 0 {
				return es[j].Line == 0 && es[i].Line != 0
			}
			return es[i].Line < es[j].Line
		}
		return es[i].Col < es[j].Col
	})
}
