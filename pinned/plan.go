package pinned

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/strata-ai/strata/internal/units"
)

// ErrBudget is matched (errors.Is) by every error saying the budget is too
// small: a *BudgetError from Get, and the error of Check.
var ErrBudget = errors.New("pinned: budget exceeded")

// BudgetError is Get's error when the budget cannot hold a request.
type BudgetError struct {
	BudgetBytes      int64
	RequestBytes     int64
	PaddedBytes      int64
	Purpose          string
	InUse            []PurposeStats // by purpose, sorted by name
	FreeBytes        int64          // budget minus bytes in use
	LargestFreeBytes int64          // largest contiguous free run
}

func (e *BudgetError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pinned: budget %s exceeded by request of %s for %q: in use: %s",
		units.FormatBytes(e.BudgetBytes), units.FormatBytes(e.RequestBytes), e.Purpose, byPurpose(e.InUse))
	if e.FreeBytes >= e.PaddedBytes {
		fmt.Fprintf(&b, "; %s free but fragmented (largest run %s)", units.FormatBytes(e.FreeBytes), units.FormatBytes(e.LargestFreeBytes))
	} else {
		fmt.Fprintf(&b, "; %s free", units.FormatBytes(e.FreeBytes))
	}
	return b.String()
}

// Is makes errors.Is(err, ErrBudget) true.
func (e *BudgetError) Is(target error) bool { return target == ErrBudget }

// byPurpose lists purposes holding memory, largest first: "optimizer states
// 128.0 MiB (4 buffers), param staging 96.0 MiB (3 buffers)".
func byPurpose(ps []PurposeStats) string {
	ps = append([]PurposeStats(nil), ps...)
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].InUseBytes > ps[j].InUseBytes })
	var parts []string
	for _, s := range ps {
		if s.Count == 0 {
			continue
		}
		unit := "buffers"
		if s.Count == 1 {
			unit = "buffer"
		}
		parts = append(parts, fmt.Sprintf("%s %s (%d %s)", s.Purpose, units.FormatBytes(s.InUseBytes), s.Count, unit))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// Requirement is what one purpose needs: Count buffers of SizeBytes.
type Requirement struct {
	Purpose   string
	SizeBytes int64
	Count     int
}

// PlanLine is one requirement with its padded cost.
type PlanLine struct {
	Requirement
	PaddedBytes int64 // one buffer, rounded up to the alignment
	TotalBytes  int64 // PaddedBytes × Count
}

// Plan is the start-up check of a list of requirements against a budget.
type Plan struct {
	BudgetBytes int64 // mapped bytes: the budget rounded down to the alignment
	NeedBytes   int64 // sum of the lines' TotalBytes
	Lines       []PlanLine
	Fits        bool
	Why         string // when it does not fit
}

// String lists what needs how much: "needs 224.0 MiB of budget 256.0 MiB:
// optimizer states 4 × 32.0 MiB = 128.0 MiB, ...".
func (p Plan) String() string {
	var parts []string
	for _, l := range p.Lines {
		parts = append(parts, fmt.Sprintf("%s %d × %s = %s", l.Purpose, l.Count, units.FormatBytes(l.PaddedBytes), units.FormatBytes(l.TotalBytes)))
	}
	s := fmt.Sprintf("needs %s of budget %s: %s", units.FormatBytes(p.NeedBytes), units.FormatBytes(p.BudgetBytes), strings.Join(parts, ", "))
	if !p.Fits {
		s += "; " + p.Why
	}
	return s
}

// Check says up front whether reqs fit a pool made with o: their padded
// sizes summed within the mapped budget. The error (errors.Is ErrBudget when
// too small) carries the Plan's listing. A plan that fits is met at run time
// by a fresh pool's Gets in any order (buffers are carved from one mapping
// and may span arenas); Puts and Gets of mixed sizes afterwards can leave
// it fragmented (Get's error then says so).
func Check(o Options, reqs []Requirement) (Plan, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return Plan{}, err
	}
	pl := Plan{Fits: true}
	for _, s := range o.arenaSizes() {
		pl.BudgetBytes += s
	}
	for _, r := range reqs {
		if r.SizeBytes <= 0 || r.Count < 0 || r.Purpose == "" {
			return Plan{}, fmt.Errorf("pinned: requirement %+v needs a purpose, a positive size and a count >= 0", r)
		}
		padded := units.AlignUp(r.SizeBytes, o.AlignBytes)
		pl.Lines = append(pl.Lines, PlanLine{Requirement: r, PaddedBytes: padded, TotalBytes: padded * int64(r.Count)})
		pl.NeedBytes += padded * int64(r.Count)
	}
	if pl.NeedBytes > pl.BudgetBytes {
		pl.Fits, pl.Why = false, fmt.Sprintf("short by %s", units.FormatBytes(pl.NeedBytes-pl.BudgetBytes))
		return pl, planError{pl}
	}
	return pl, nil
}

type planError struct{ plan Plan }

func (e planError) Error() string        { return "pinned: plan " + e.plan.String() }
func (e planError) Is(target error) bool { return target == ErrBudget }
