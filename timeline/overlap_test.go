package timeline

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestOverlapSynthetic: Overlap on a hand-made timeline, every figure
// worked out on paper (integer milliseconds, so the arithmetic is exact).
//
//	step 1 [0, 100], step 2 [100, 250] (its span starts at 110: the window
//	starts where step 1 ended)
//	nvme->host: [10, 50] and [30, 70] (two lanes: busy 60), [90, 120] (ends
//	in step 2: busy 10 in step 1, 20 in step 2; bytes in step 2)
//	host->hbm (rank 1): [60, 80]
//	host->nvme: [200, 260] (busy 50 in step 2; bytes in no window: it ends
//	after the last step)
//	rank 0 stalls: [40, 65] and [85, 95] in step 1; [130, 140] in step 2
//	rank 1 stalls: [0, 5] (no transfer: stall, not exposed)
func TestOverlapSynthetic(t *testing.T) {
	d := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	step := func(s int64, a, b int) Event {
		return Event{Name: fmt.Sprint("step ", s), Cat: CatStep, Phase: 'X', Start: d(a), Dur: d(b - a), Step: s, Rank: -1}
	}
	move := func(l shard.Link, r, a, b int, n int64) Event {
		return Event{Name: "m", Cat: CatMove, Phase: 'X', Start: d(a), Dur: d(b - a), Link: l, Bytes: n, Rank: r}
	}
	stall := func(r, a, b int) Event {
		return Event{Name: "s", Cat: CatStall, Phase: 'X', Start: d(a), Dur: d(b - a), Rank: r}
	}
	evs := []Event{
		step(2, 110, 250), step(1, 0, 100),
		{Name: "step 1", Cat: CatStep, Phase: 'i', Step: 1}, // instants are not windows
		move(shard.NVMeToHost, 0, 10, 50, 1000), move(shard.NVMeToHost, 0, 30, 70, 2000), move(shard.NVMeToHost, 1, 90, 120, 4000),
		move(shard.HostToHBM, 1, 60, 80, 300),
		move(shard.HostToNVMe, 0, 200, 260, 5000),
		stall(0, 40, 65), stall(0, 85, 95), stall(0, 130, 140), stall(1, 0, 5),
		{Name: "fwd", Cat: CatCompute, Phase: 'X', Start: d(0), Dur: d(250)}, // ignored
	}
	got := Overlap(evs)
	want := []StepOverlap{{
		Step: 1, Start: d(0), Duration: d(100),
		Stall: []time.Duration{d(35), d(5)}, StallMax: d(35),
		LinkBusy:     [shard.LinkCount]time.Duration{shard.NVMeToHost: d(70), shard.HostToHBM: d(20)},
		LinkBytes:    [shard.LinkCount]int64{shard.NVMeToHost: 3000, shard.HostToHBM: 300},
		TransferBusy: d(80), // [10, 80] and [90, 100]
		// rank 0: [40, 65] ∩ busy = 25, [85, 95] ∩ [90, 100] = 5; rank 1: 0
		Exposed: d(30), ExposedFraction: 30.0 / 80,
	}, {
		Step: 2, Start: d(100), Duration: d(150),
		Stall: []time.Duration{d(10), 0}, StallMax: d(10),
		LinkBusy:     [shard.LinkCount]time.Duration{shard.NVMeToHost: d(20), shard.HostToNVMe: d(50)},
		LinkBytes:    [shard.LinkCount]int64{shard.NVMeToHost: 4000},
		TransferBusy: d(70),
		// rank 0's stall [130, 140] falls between the read (ends 120) and
		// the write (starts 200): not exposed.
		Exposed: 0, ExposedFraction: 0,
	}}
	if len(got) != len(want) {
		t.Fatalf("%d steps, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if !reflect.DeepEqual(g, w) {
			t.Errorf("step %d:\n got %+v\nwant %+v", w.Step, g, w)
		}
	}
	tot := TotalOverlap(got)
	if tot.Step != 2 || tot.Duration != d(250) || tot.TransferBusy != d(150) || tot.Exposed != d(30) || tot.ExposedFraction != 0.2 ||
		tot.LinkBytes[shard.NVMeToHost] != 7000 || !slices.Equal(tot.Stall, []time.Duration{d(45), d(5)}) || tot.StallMax != d(45) {
		t.Errorf("total %+v", tot)
	}
	if s := got[0].String(); !strings.Contains(s, "exposed 30.0 ms = 37.5 %") {
		t.Errorf("String: %s", s)
	}
	if Overlap(nil) == nil || len(Overlap(nil)) != 0 {
		t.Error("Overlap(nil) should be an empty list")
	}
}

// TestOverlapIntervals: the overlap analysis proper (overlapOf), a pure
// function of recorded intervals, case by case, every figure worked out
// on paper in integer milliseconds.
func TestOverlapIntervals(t *testing.T) {
	d := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	sp := func(a, b int) span { return span{d(a), d(b)} }
	step := func(s int64, a, b int) stepWindow { return stepWindow{s, d(a), d(b)} }
	move := func(l shard.Link, a, b int, n int64) linkSpan { return linkSpan{l, sp(a, b), n} }
	frac := func(a, b int) float64 { return float64(d(a)) / float64(d(b)) }
	type links = [shard.LinkCount]time.Duration
	type bytes = [shard.LinkCount]int64
	for _, tc := range []struct {
		name string
		iv   intervals
		want []StepOverlap
	}{{
		name: "no step: nothing to count in",
		iv:   intervals{stalls: [][]span{{sp(0, 10)}}, moves: []linkSpan{move(shard.NVMeToHost, 0, 10, 1)}},
		want: []StepOverlap{},
	}, {
		name: "a wait with no transfer is stall, not exposed",
		iv:   intervals{steps: []stepWindow{step(1, 0, 100)}, stalls: [][]span{{sp(10, 30)}}},
		want: []StepOverlap{{Step: 1, Duration: d(100), Stall: []time.Duration{d(20)}, StallMax: d(20)}},
	}, {
		name: "a transfer hidden behind compute",
		iv:   intervals{steps: []stepWindow{step(1, 0, 100)}, moves: []linkSpan{move(shard.NVMeToHost, 10, 50, 1000)}},
		want: []StepOverlap{{Step: 1, Duration: d(100), Stall: []time.Duration{},
			LinkBusy: links{shard.NVMeToHost: d(40)}, LinkBytes: bytes{shard.NVMeToHost: 1000}, TransferBusy: d(40)}},
	}, {
		name: "a rank's overlapping waits count once",
		iv: intervals{steps: []stepWindow{step(1, 0, 100)}, stalls: [][]span{{sp(30, 50), sp(20, 40)}},
			moves: []linkSpan{move(shard.HostToHBM, 0, 60, 500)}},
		want: []StepOverlap{{Step: 1, Duration: d(100), Stall: []time.Duration{d(30)}, StallMax: d(30),
			LinkBusy: links{shard.HostToHBM: d(60)}, LinkBytes: bytes{shard.HostToHBM: 500}, TransferBusy: d(60),
			Exposed: d(30), ExposedFraction: frac(30, 60)}},
	}, {
		name: "exposed is the worst rank's, not the longest stall's",
		iv: intervals{steps: []stepWindow{step(1, 0, 100)}, stalls: [][]span{{sp(0, 10)}, {sp(20, 60)}, nil},
			moves: []linkSpan{move(shard.NVMeToHost, 0, 40, 7)}},
		want: []StepOverlap{{Step: 1, Duration: d(100), Stall: []time.Duration{d(10), d(40), 0}, StallMax: d(40),
			LinkBusy: links{shard.NVMeToHost: d(40)}, LinkBytes: bytes{shard.NVMeToHost: 7}, TransferBusy: d(40),
			Exposed: d(20), ExposedFraction: frac(20, 40)}},
	}, {
		name: "links busy at once count once in the transfer time",
		iv: intervals{steps: []stepWindow{step(1, 0, 100)}, stalls: [][]span{{sp(50, 70)}},
			moves: []linkSpan{move(shard.NVMeToHost, 0, 40, 1), move(shard.HostToHBM, 20, 60, 2), move(shard.HostToHBM, 50, 55, 4)}},
		want: []StepOverlap{{Step: 1, Duration: d(100), Stall: []time.Duration{d(20)}, StallMax: d(20),
			LinkBusy: links{shard.NVMeToHost: d(40), shard.HostToHBM: d(40)}, LinkBytes: bytes{shard.NVMeToHost: 1, shard.HostToHBM: 6},
			TransferBusy: d(60), Exposed: d(10), ExposedFraction: frac(10, 60)}},
	}, {
		// Step 2's span starts at 60: its window starts where step 1
		// ended (50). The read [40, 70] is busy in both windows, its bytes
		// in step 2, where it ends; the read [-20, -10] ends before the
		// first window, which takes its bytes; [90, 120] ends after the
		// last step: busy in step 2, its bytes nowhere. The wait [45, 55]
		// is cut in two.
		name: "windows chain from the step before and clip the spans",
		iv: intervals{steps: []stepWindow{step(2, 60, 100), step(1, 0, 50)}, stalls: [][]span{{sp(45, 55)}},
			moves: []linkSpan{move(shard.NVMeToHost, 40, 70, 700), move(shard.NVMeToHost, -20, -10, 100), move(shard.NVMeToHost, 90, 120, 50)}},
		want: []StepOverlap{{Step: 1, Duration: d(50), Stall: []time.Duration{d(5)}, StallMax: d(5),
			LinkBusy: links{shard.NVMeToHost: d(10)}, LinkBytes: bytes{shard.NVMeToHost: 100}, TransferBusy: d(10),
			Exposed: d(5), ExposedFraction: frac(5, 10)},
			{Step: 2, Start: d(50), Duration: d(50), Stall: []time.Duration{d(5)}, StallMax: d(5),
				LinkBusy: links{shard.NVMeToHost: d(30)}, LinkBytes: bytes{shard.NVMeToHost: 700}, TransferBusy: d(30),
				Exposed: d(5), ExposedFraction: frac(5, 30)}},
	}, {
		name: "a step that starts before the one before ends keeps its start",
		iv:   intervals{steps: []stepWindow{step(1, 0, 50), step(2, 40, 90)}},
		want: []StepOverlap{{Step: 1, Duration: d(50), Stall: []time.Duration{}},
			{Step: 2, Start: d(40), Duration: d(50), Stall: []time.Duration{}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := overlapOf(tc.iv)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestTraceLanes: moves that overlap on a link get lanes, each lane holds
// disjoint spans, and a freed lane is reused.
func TestTraceLanes(t *testing.T) {
	d := func(v int) time.Duration { return time.Duration(v) }
	evs := []Event{
		{Cat: CatMove, Pid: 1, Link: shard.HostToHBM, Start: d(0), Dur: d(10)},
		{Cat: CatMove, Pid: 1, Link: shard.HostToHBM, Start: d(5), Dur: d(10)},
		{Cat: CatMove, Pid: 1, Link: shard.HostToHBM, Start: d(10), Dur: d(3)},
		{Cat: CatMove, Pid: 2, Link: shard.HostToHBM, Start: d(10), Dur: d(3)},
		{Cat: CatMove, Pid: 1, Link: shard.HBMToHost, Start: d(11), Dur: d(3)},
	}
	assignLanes(evs)
	var tids []int
	for _, ev := range evs {
		tids = append(tids, ev.Tid)
	}
	if want := []int{200, 201, 200, 200, 300}; !slices.Equal(tids, want) {
		t.Errorf("tids %v, want %v", tids, want)
	}
}

// TestExposedOf: the overlap figures of cpuadam against the compute
// stream are interval arithmetic: busy time sums the runs, exposed time is
// what of their union no compute span covers.
func TestExposedOf(t *testing.T) {
	ms := func(a, b int) span {
		return span{time.Duration(a) * time.Millisecond, time.Duration(b) * time.Millisecond}
	}
	for _, tc := range []struct {
		name                string
		busy, adam, wait    []span
		adam_, exp, io, ioE int // ms
	}{
		{"none", nil, nil, nil, 0, 0, 0, 0},
		{"all exposed", nil, []span{ms(0, 2), ms(5, 6)}, []span{ms(2, 3)}, 3, 3, 1, 1},
		{"hidden", []span{ms(0, 10)}, []span{ms(1, 3), ms(4, 9)}, []span{ms(3, 4)}, 7, 0, 1, 0},
		{"partly", []span{ms(2, 4), ms(3, 6), ms(8, 9)}, []span{ms(0, 5), ms(7, 10)}, []span{ms(5, 8)}, 8, 4, 3, 2},
	} {
		h := exposedOf(tc.busy, tc.adam, tc.wait)
		want := Exposure{Adam: ms(0, tc.adam_).b, AdamExposed: ms(0, tc.exp).b, IOWait: ms(0, tc.io).b, IOExposed: ms(0, tc.ioE).b}
		if h != want {
			t.Errorf("%s: %+v, want %+v", tc.name, h, want)
		}
	}
}
