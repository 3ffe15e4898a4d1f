//go:build !linux

package nvme

import "fmt"

// ProbeDirectIO says whether the filesystem of dir does direct I/O: never,
// off Linux.
func ProbeDirectIO(string) error { return fmt.Errorf("%w (%w)", errNotLinux, ErrNoDirectIO) }
