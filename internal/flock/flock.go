// Package flock is the one exclusive lock Strata puts on a file that
// belongs to one run (a swap file, a run directory's strata.lock): a
// flock(2) on an open file, so it goes with the last close or the death of
// the process, never to a stale holder, and the holder is named from
// /proc/locks, not from anything the holder had to write first.
package flock

import "errors"

// ErrHeld says another open file (another run) holds the lock.
var ErrHeld = errors.New("locked by another process")

// ErrNotSupported says this platform has no flock here.
var ErrNotSupported = errors.New("flock: not supported on this platform")
