//go:build !race

package data

// raceEnabled: the race detector is off.
const raceEnabled = false
