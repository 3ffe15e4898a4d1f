//go:build race

package cmd

// raceEnabled: the race detector is on (its shadow memory multiplies the
// heap's footprint and it slows the code down many times).
const raceEnabled = true
