package units

import (
	"io"
	"slices"
)

// Median is the middle of v (the mean of the two middle ones for an even
// count); 0 for none. v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ErrWriter is a writer for a printed table: it keeps the first error of
// W's writes in Err and drops the writes after it, so the printing code
// checks once at the end.
type ErrWriter struct {
	W   io.Writer
	Err error
}

// Write writes p to W unless an earlier write failed; it never returns an
// error (Err holds it).
func (e *ErrWriter) Write(p []byte) (int, error) {
	if e.Err != nil {
		return len(p), nil
	}
	_, e.Err = e.W.Write(p)
	return len(p), nil
}
