//go:build linux

package durable

import (
	"errors"
	"syscall"
)

// pidAlive says whether pid is a process (this namespace's); EPERM means
// it is, another user's.
func pidAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// openTempFlags open a temporary to lock it: never a link's target, never
// waiting on a FIFO planted under a temporary's name.
const openTempFlags = syscall.O_NONBLOCK | syscall.O_NOFOLLOW
