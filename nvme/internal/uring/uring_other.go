//go:build !linux

// Package uring binds Linux io_uring; on other systems New reports that it is
// not supported.
package uring

import "errors"

// ErrNotSupported is returned by New outside Linux.
var ErrNotSupported = errors.New("uring: io_uring exists only on Linux")
