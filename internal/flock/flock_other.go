//go:build !linux

package flock

// TryLock is not built off Linux.
func TryLock(int) error { return ErrNotSupported }

// Holder is not built off Linux.
func Holder(int) string { return "holder unknown" }

// unlock is not built off Linux.
func unlock(int) {}
