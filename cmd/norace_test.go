//go:build !race

package cmd

// raceEnabled: the race detector is off.
const raceEnabled = false
