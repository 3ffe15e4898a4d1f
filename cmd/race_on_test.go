//go:build race

package cmd

// raceDetector says whether the tests run under the race detector, whose
// shadow memory is in every peak RSS a test reads.
const raceDetector = true
