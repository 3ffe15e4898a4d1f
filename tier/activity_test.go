package tier

import (
	"testing"
	"time"
)

// TestActivityUnion: a link's Active time counts overlapping hops once and
// the gaps between them not at all, the open hop up to the snapshot.
func TestActivityUnion(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var a activity
	a.enter(at(0))  // hop 1: 0-30
	a.enter(at(10)) // hop 2: 10-50
	a.exit(at(30))
	if got := a.total(at(40)); got != 40*time.Millisecond {
		t.Fatalf("open union at 40 ms: %v, want 40ms", got)
	}
	a.exit(at(50))
	a.enter(at(80)) // hop 3: 80-100, after 30 ms idle
	a.exit(at(100))
	if got, want := a.total(at(200)), 70*time.Millisecond; got != want {
		t.Fatalf("union %v, want %v (50 ms of two overlapping hops, 20 ms of a third)", got, want)
	}
}
