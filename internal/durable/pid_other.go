//go:build !linux

package durable

// pidAlive: off Linux no temporary is provably dead.
func pidAlive(int) bool { return true }

const openTempFlags = 0
