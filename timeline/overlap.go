package timeline

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/strata-ai/strata/shard"
)

// StepOverlap is one step's overlap of transfers with the devices' work,
// computed from the timeline (Overlap).
type StepOverlap struct {
	Step int64
	// Start and Duration are the step's window: from the end of the step
	// before (the first step: its own start) to its end, the same window as
	// StepStats.Tier (moves between steps count in the next one).
	Start, Duration time.Duration
	// Stall is, per device, the time its rank waited for shards (the union
	// of its shard-wait spans in the window); StallMax the largest.
	Stall    []time.Duration
	StallMax time.Duration
	// LinkBusy is, per link, the time any move was on it (the union of
	// its spans in the window, all devices and lanes); LinkBytes the bytes
	// of the moves that completed in the window.
	LinkBusy  [shard.LinkCount]time.Duration
	LinkBytes [shard.LinkCount]int64
	// TransferBusy is the time any link was busy (the union over links).
	TransferBusy time.Duration
	// Exposed is the exposed transfer time: the largest, over devices, of
	// the time the device waited for shards while a transfer was under way
	// (its stall intersected with TransferBusy). A wait with no transfer
	// running (for room, for the planner) is stall but not exposed.
	Exposed time.Duration
	// ExposedFraction is Exposed / TransferBusy (0 without transfers): the
	// share of the transfer time the devices did not hide.
	ExposedFraction float64
}

func (o StepOverlap) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d: %.1f ms, transfers %.1f ms (", o.Step, ms(o.Duration), ms(o.TransferBusy))
	for l, d := range o.LinkBusy {
		if l > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.1f ms", shard.Link(l), ms(d))
	}
	fmt.Fprintf(&b, "), stall %.1f ms, exposed %.1f ms = %.1f %% of the transfer time", ms(o.StallMax), ms(o.Exposed), 100*o.ExposedFraction)
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// Overlap computes each step's overlap figures from a timeline's events
// (Tracer.Events, or any list of the same shape): windows from the
// CatStep spans, stalls from the CatStall spans (by Rank), link busy
// time and bytes from the CatMove spans (by Link). Interval arithmetic
// only: exact on the durations given.
func Overlap(events []Event) []StepOverlap {
	return overlapOf(intervalsOf(events))
}

// intervals is what the overlap analysis reads from a timeline.
type intervals struct {
	steps  []stepWindow // the steps' spans, in any order
	stalls [][]span     // per rank: its shard waits
	moves  []linkSpan
}

// stepWindow is a step's span, or (overlapOf) the window it is counted in.
type stepWindow struct {
	step       int64
	start, end time.Duration
}

// linkSpan is a move: its span on a link and the bytes it put there.
type linkSpan struct {
	link  shard.Link
	s     span
	bytes int64
}

// intervalsOf takes the complete spans of steps, shard waits and moves
// from events; a rank is counted from any of its shard-wait events.
func intervalsOf(events []Event) intervals {
	var iv intervals
	for _, ev := range events {
		if ev.Cat == CatStall {
			for len(iv.stalls) <= ev.Rank {
				iv.stalls = append(iv.stalls, nil)
			}
		}
		if ev.Phase != 'X' {
			continue
		}
		s := span{ev.Start, ev.End()}
		switch ev.Cat {
		case CatStep:
			iv.steps = append(iv.steps, stepWindow{ev.Step, s.a, s.b})
		case CatStall:
			iv.stalls[ev.Rank] = append(iv.stalls[ev.Rank], s)
		case CatMove:
			iv.moves = append(iv.moves, linkSpan{ev.Link, s, ev.Bytes})
		}
	}
	return iv
}

// overlapOf is the analysis proper, a pure function of the intervals: the
// steps in order, each counted from the end of the one before (the first
// from its own start) to its end; in each window the union of every
// rank's waits, of each link's moves and of all moves, clipped to it; the
// bytes of a move in the window where it ends (the first window also
// takes the moves that end before it).
func overlapOf(iv intervals) []StepOverlap {
	wins := slices.Clone(iv.steps)
	slices.SortFunc(wins, func(a, b stepWindow) int { return cmp.Compare(a.step, b.step) })
	for i := 1; i < len(wins); i++ {
		wins[i].start = min(wins[i-1].end, wins[i].start)
	}
	out := make([]StepOverlap, 0, len(wins))
	for i, w := range wins {
		out = append(out, stepOverlap(w, i == 0, iv))
	}
	return out
}

// stepOverlap is the figures of the window w (first: the first window).
func stepOverlap(w stepWindow, first bool, iv intervals) StepOverlap {
	o := StepOverlap{Step: w.step, Start: w.start, Duration: w.end - w.start, Stall: make([]time.Duration, len(iv.stalls))}
	var links [shard.LinkCount][]span
	var all []span
	for _, m := range iv.moves {
		// Bytes count where the move completed: (start, end], and the
		// first window takes everything before it too.
		if m.s.b <= w.end && (m.s.b > w.start || first) {
			o.LinkBytes[m.link] += m.bytes
		}
		if s, ok := clip(m.s, w.start, w.end); ok {
			links[m.link] = append(links[m.link], s)
			all = append(all, s)
		}
	}
	for l := range links {
		o.LinkBusy[l] = length(union(links[l]))
	}
	busy := union(all)
	o.TransferBusy = length(busy)
	for r, ss := range iv.stalls {
		var in []span
		for _, s := range ss {
			if s, ok := clip(s, w.start, w.end); ok {
				in = append(in, s)
			}
		}
		u := union(in)
		o.Stall[r] = length(u)
		o.StallMax = max(o.StallMax, o.Stall[r])
		o.Exposed = max(o.Exposed, length(intersect(u, busy)))
	}
	if o.TransferBusy > 0 {
		o.ExposedFraction = float64(o.Exposed) / float64(o.TransferBusy)
	}
	return o
}

// TotalOverlap adds up steps' figures (Step is the number of steps): the
// durations, stalls, busy times and bytes sum; ExposedFraction is the
// total Exposed over the total TransferBusy.
func TotalOverlap(steps []StepOverlap) StepOverlap {
	var t StepOverlap
	for i, o := range steps {
		if i == 0 {
			t.Start = o.Start
		}
		t.Step++
		t.Duration += o.Duration
		for r, d := range o.Stall {
			for len(t.Stall) <= r {
				t.Stall = append(t.Stall, 0)
			}
			t.Stall[r] += d
		}
		t.StallMax += o.StallMax
		for l := range t.LinkBusy {
			t.LinkBusy[l] += o.LinkBusy[l]
			t.LinkBytes[l] += o.LinkBytes[l]
		}
		t.TransferBusy += o.TransferBusy
		t.Exposed += o.Exposed
	}
	if t.TransferBusy > 0 {
		t.ExposedFraction = float64(t.Exposed) / float64(t.TransferBusy)
	}
	return t
}

// span is a half-open interval [a, b).
type span struct{ a, b time.Duration }

func clip(s span, lo, hi time.Duration) (span, bool) {
	s.a, s.b = max(s.a, lo), min(s.b, hi)
	return s, s.a < s.b
}

// union merges spans into sorted disjoint spans.
func union(ss []span) []span {
	if len(ss) == 0 {
		return nil
	}
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(x, y span) int { return cmp.Compare(x.a, y.a) })
	out := []span{ss[0]}
	for _, s := range ss[1:] {
		last := &out[len(out)-1]
		if s.a <= last.b {
			last.b = max(last.b, s.b)
			continue
		}
		out = append(out, s)
	}
	return out
}

// intersect is the intersection of two sorted disjoint span lists.
func intersect(x, y []span) []span {
	var out []span
	for i, j := 0, 0; i < len(x) && j < len(y); {
		a, b := max(x[i].a, y[j].a), min(x[i].b, y[j].b)
		if a < b {
			out = append(out, span{a, b})
		}
		if x[i].b < y[j].b {
			i++
		} else {
			j++
		}
	}
	return out
}

func length(ss []span) time.Duration {
	var d time.Duration
	for _, s := range ss {
		d += s.b - s.a
	}
	return d
}

// Exposure is one rank's host-optimizer time against its compute stream
// (the busy log's figures; the engine's HostOptStats): cpuadam's busy
// time and the part of it with the compute stream idle, the waits for the
// optimizer's state and their idle part.
type Exposure struct {
	Adam, AdamExposed, IOWait, IOExposed time.Duration
}

// busyLog is one rank's record of what the overlap figures need: the
// spans its compute stream was busy (the chunks' forward and backward, as
// the stream clock times them), cpuadam's runs and the optimizer-state
// waits, on the engine's clock. It is kept whenever the host optimizer
// runs, with or without a timeline.
type busyLog struct {
	t0               time.Time
	mu               sync.Mutex
	busy, adam, wait []span
}

func (l *busyLog) at(t time.Time) time.Duration { return t.Sub(l.t0) }

func (l *busyLog) put(to *[]span, t0, t1 time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*to = append(*to, span{l.at(t0), l.at(t1)})
}

func (l *busyLog) compute(t0, t1 time.Time) { l.put(&l.busy, t0, t1) }

// take computes the figures of the cpuadam runs and waits logged so far
// and forgets every span (the caller has flushed the compute clock).
func (l *busyLog) take() Exposure {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := exposedOf(l.busy, l.adam, l.wait)
	l.busy, l.adam, l.wait = l.busy[:0], l.adam[:0], l.wait[:0]
	return h
}

// exposedOf is the figures of cpuadam runs adam and waits wait against
// the compute stream's busy spans: a pure function of the intervals.
func exposedOf(busy, adam, wait []span) Exposure {
	b := union(busy)
	var h Exposure
	for _, s := range adam {
		h.Adam += s.b - s.a
	}
	for _, s := range wait {
		h.IOWait += s.b - s.a
	}
	a, w := union(adam), union(wait)
	h.AdamExposed = length(a) - length(intersect(a, b))
	h.IOExposed = length(w) - length(intersect(w, b))
	return h
}
