package engine

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/strata-ai/strata/tier"
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
	LinkBusy  [tier.LinkCount]time.Duration
	LinkBytes [tier.LinkCount]int64
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
		fmt.Fprintf(&b, "%s %.1f ms", tier.Link(l), ms(d))
	}
	fmt.Fprintf(&b, "), stall %.1f ms, exposed %.1f ms = %.1f %% of the transfer time", ms(o.StallMax), ms(o.Exposed), 100*o.ExposedFraction)
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// Overlap computes each step's overlap figures from a timeline's events
// (Tracer.Events, or any list of the same shape): windows from the
// TraceStep spans, stalls from the TraceStall spans (by Rank), link busy
// time and bytes from the TraceMove spans (by Link). Interval arithmetic
// only: exact on the durations given.
func Overlap(events []TraceEvent) []StepOverlap {
	type win struct {
		step       int64
		start, end time.Duration
	}
	var wins []win
	ranks := 0
	for _, ev := range events {
		if ev.Cat == TraceStep && ev.Phase == 'X' {
			wins = append(wins, win{ev.Step, ev.Start, ev.End()})
		}
		if ev.Cat == TraceStall {
			ranks = max(ranks, ev.Rank+1)
		}
	}
	slices.SortFunc(wins, func(a, b win) int { return cmp.Compare(a.step, b.step) })
	for i := 1; i < len(wins); i++ {
		wins[i].start = min(wins[i-1].end, wins[i].start)
	}
	out := make([]StepOverlap, 0, len(wins))
	for i, w := range wins {
		o := StepOverlap{Step: w.step, Start: w.start, Duration: w.end - w.start, Stall: make([]time.Duration, ranks)}
		var links [tier.LinkCount][]span
		var all []span
		stalls := make([][]span, ranks)
		for _, ev := range events {
			if ev.Phase != 'X' {
				continue
			}
			s, ok := clip(span{ev.Start, ev.End()}, w.start, w.end)
			switch ev.Cat {
			case TraceMove:
				// Bytes count where the move completed: (start, end], and
				// the first window takes everything before it too.
				if end := ev.End(); end <= w.end && (end > w.start || i == 0) {
					o.LinkBytes[ev.Link] += ev.Bytes
				}
				if ok {
					links[ev.Link] = append(links[ev.Link], s)
					all = append(all, s)
				}
			case TraceStall:
				if ok {
					stalls[ev.Rank] = append(stalls[ev.Rank], s)
				}
			}
		}
		for l := range links {
			o.LinkBusy[l] = length(union(links[l]))
		}
		busy := union(all)
		o.TransferBusy = length(busy)
		for r := range stalls {
			u := union(stalls[r])
			o.Stall[r] = length(u)
			o.StallMax = max(o.StallMax, o.Stall[r])
			o.Exposed = max(o.Exposed, length(intersect(u, busy)))
		}
		if o.TransferBusy > 0 {
			o.ExposedFraction = float64(o.Exposed) / float64(o.TransferBusy)
		}
		out = append(out, o)
	}
	return out
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
