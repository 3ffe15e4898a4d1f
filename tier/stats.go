package tier

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// Usage is one budget's bytes.
type Usage struct {
	BudgetBytes int64
	InUseBytes  int64 // copies, reservations of moves in flight, staging buffers
	PeakBytes   int64 // highest InUseBytes since New or ResetPeaks
}

// LinkStats are the counters of one link.
type LinkStats struct {
	Bytes int64         // bytes moved (NVMe: whole extents, padded to the swap's alignment)
	Moves int64         // hops completed
	Busy  time.Duration // sum over hops of the time each took (hops overlap: can exceed wall time)
	// Active is the time at least one hop was on the link (the union of
	// the hops' spans, failed ones included, up to the snapshot): the
	// link's busy time, at most the wall time.
	Active time.Duration
}

// activity is the union of a link's hops in time: how many are on it now,
// since when, and the closed intervals' total.
type activity struct {
	mu     sync.Mutex
	on     int
	since  time.Time
	closed time.Duration
}

// enter counts a hop on the link from now.
func (a *activity) enter(now time.Time) {
	a.mu.Lock()
	if a.on == 0 {
		a.since = now
	}
	a.on++
	a.mu.Unlock()
}

// exit ends at now a hop that entered.
func (a *activity) exit(now time.Time) {
	a.mu.Lock()
	if a.on--; a.on == 0 {
		a.closed += now.Sub(a.since)
	}
	a.mu.Unlock()
}

// total is the union until now, the open interval included.
func (a *activity) total(now time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.on > 0 {
		return a.closed + now.Sub(a.since)
	}
	return a.closed
}

// Stats are the store's counters since New.
type Stats struct {
	Links [shard.LinkCount]LinkStats
	HBM   []Usage // per device
	Host  Usage
	NVMe  Usage
	// Moves accepted by Submit, of which Instant completed within it;
	// Completed and Failed count asynchronous moves that ended.
	Submitted, Instant, Completed, Failed int64
	InFlight                              int
	// FlightTime is the sum of the durations of the asynchronous moves.
	FlightTime time.Duration
	// Waited is the time Acquire blocked on moves, per tier; Waits the
	// number of Acquires that blocked.
	Waited [shard.TierCount]time.Duration
	Waits  [shard.TierCount]int64
	Shards int
}

func (u usage) out() Usage {
	return Usage{BudgetBytes: u.budget, InUseBytes: u.inUse, PeakBytes: u.peak}
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Host: s.pools[poolHost].out(), NVMe: s.pools[poolNVMe].out(),
		Submitted: s.submitted, Instant: s.instant, Completed: s.completed, Failed: s.failed,
		InFlight: s.inFlight, FlightTime: s.flightTime, Waited: s.waited, Waits: s.waits, Shards: len(s.entries),
	}
	for i := range s.devs {
		st.HBM = append(st.HBM, s.pools[poolHBM+i].out())
	}
	for l := range s.links {
		st.Links[l] = LinkStats{Bytes: s.links[l].bytes, Moves: s.links[l].moves, Busy: s.links[l].busy, Active: s.active[l].total(time.Now())}
	}
	return st
}

func (st Stats) String() string {
	var b strings.Builder
	for i, u := range st.HBM {
		fmt.Fprintf(&b, "hbm%d %s/%s (peak %s); ", i, units.FormatBytes(u.InUseBytes), units.FormatBytes(u.BudgetBytes), units.FormatBytes(u.PeakBytes))
	}
	fmt.Fprintf(&b, "host %s/%s (peak %s); nvme %s/%s (peak %s)",
		units.FormatBytes(st.Host.InUseBytes), units.FormatBytes(st.Host.BudgetBytes), units.FormatBytes(st.Host.PeakBytes),
		units.FormatBytes(st.NVMe.InUseBytes), units.FormatBytes(st.NVMe.BudgetBytes), units.FormatBytes(st.NVMe.PeakBytes))
	for l, ls := range st.Links {
		fmt.Fprintf(&b, "; %s %s in %d", shard.Link(l), units.FormatBytes(ls.Bytes), ls.Moves)
	}
	fmt.Fprintf(&b, "; moves %d (%d instant, %d failed, %d in flight)", st.Submitted, st.Instant, st.Failed, st.InFlight)
	return b.String()
}

// ResetPeaks sets every peak to the current use (at a step boundary).
func (s *Store) ResetPeaks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.pools {
		s.pools[i].peak = s.pools[i].inUse
	}
}
