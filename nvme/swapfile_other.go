//go:build !linux

package nvme

func lockSwap(*File) error { return errNotLinux }

func staleSwapFiles(string, bool) ([]StaleFile, error) { return nil, errNotLinux }
