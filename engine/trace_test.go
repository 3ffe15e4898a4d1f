package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
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
	step := func(s int64, a, b int) TraceEvent {
		return TraceEvent{Name: fmt.Sprint("step ", s), Cat: TraceStep, Phase: 'X', Start: d(a), Dur: d(b - a), Step: s, Rank: -1}
	}
	move := func(l shard.Link, r, a, b int, n int64) TraceEvent {
		return TraceEvent{Name: "m", Cat: TraceMove, Phase: 'X', Start: d(a), Dur: d(b - a), Link: l, Bytes: n, Rank: r}
	}
	stall := func(r, a, b int) TraceEvent {
		return TraceEvent{Name: "s", Cat: TraceStall, Phase: 'X', Start: d(a), Dur: d(b - a), Rank: r}
	}
	evs := []TraceEvent{
		step(2, 110, 250), step(1, 0, 100),
		{Name: "step 1", Cat: TraceStep, Phase: 'i', Step: 1}, // instants are not windows
		move(shard.NVMeToHost, 0, 10, 50, 1000), move(shard.NVMeToHost, 0, 30, 70, 2000), move(shard.NVMeToHost, 1, 90, 120, 4000),
		move(shard.HostToHBM, 1, 60, 80, 300),
		move(shard.HostToNVMe, 0, 200, 260, 5000),
		stall(0, 40, 65), stall(0, 85, 95), stall(0, 130, 140), stall(1, 0, 5),
		{Name: "fwd", Cat: TraceCompute, Phase: 'X', Start: d(0), Dur: d(250)}, // ignored
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
	evs := []TraceEvent{
		{Cat: TraceMove, Pid: 1, Link: shard.HostToHBM, Start: d(0), Dur: d(10)},
		{Cat: TraceMove, Pid: 1, Link: shard.HostToHBM, Start: d(5), Dur: d(10)},
		{Cat: TraceMove, Pid: 1, Link: shard.HostToHBM, Start: d(10), Dur: d(3)},
		{Cat: TraceMove, Pid: 2, Link: shard.HostToHBM, Start: d(10), Dur: d(3)},
		{Cat: TraceMove, Pid: 1, Link: shard.HBMToHost, Start: d(11), Dur: d(3)},
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

// traceSpec is a run the timeline is checked on.
type traceSpec struct {
	name  string
	tier  *tierSpec // a tier-store run; nil: runSpec
	run   runSpec
	nvme  bool
	steps int
}

var traceSpecs = []traceSpec{
	{name: "tiered-nvme", tier: &tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}, nvme: true},
	{name: "tiered-cpu", tier: &tierSpec{n: 2, param: "cpu", opt: "cpu", shapeJSON: deepShapeJSON}},
	{name: "stage1-host-optimizer", run: runSpec{stage: 1, n: 2, offload: true, micro: 1, accum: 1}},
	{name: "stage2-device-optimizer", run: runSpec{stage: 2, n: 2, micro: 1, accum: 2}},
}

func (s traceSpec) engine(t *testing.T, tr *Tracer) *Engine {
	if s.tier != nil {
		return newTierEngine(t, *s.tier, Options{Trace: tr})
	}
	cfg := testConfig(t, s.run.configJSON())
	devs, comms, err := cpu.New(cpu.Options{Devices: s.run.n})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Trace: tr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e
}

// TestTrace runs 3 steps of tiny models with the timeline on and checks
// it: the JSON parses; every event has a name and a known pid/tid named by
// metadata, and a non-negative duration; no track holds overlapping spans
// (one stream runs one thing at a time; moves sit in lanes); each rank's
// compute stream shows every chunk it acquired, per pass and micro-batch;
// the moves add up, per link, to the bytes the tier store counted (so every
// link that moved bytes in StepStats.Tier has moves); each rank's shard
// waits add up to the stall the runner counted; and the params end
// bit-identical to the same run with the timeline off.
func TestTrace(t *testing.T) {
	for _, s := range traceSpecs {
		t.Run(s.name, func(t *testing.T) {
			if s.nvme {
				nvmetest.Require(t)
			}
			const steps = 3
			tr, err := NewTracer(TraceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			e := s.engine(t, tr)
			var before tier.Stats
			if e.tiers != nil {
				before = e.tiers.store.Stats()
			}
			var stats []StepStats
			if err := e.Run(steps, func(st StepStats) error { stats = append(stats, st); return nil }); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := e.WriteTrace(&buf); err != nil {
				t.Fatal(err)
			}
			var after tier.Stats
			if e.tiers != nil {
				// WriteTrace lets the planners go on: hold them while the
				// store's counters and the timeline are read together.
				if err := e.tiers.pause(); err != nil {
					t.Fatal(err)
				}
				after = e.tiers.store.Stats()
			}
			evs := tr.Events()
			if e.tiers != nil {
				e.tiers.resume()
			}
			checkTraceJSON(t, buf.Bytes())
			checkTracks(t, evs)
			if tr.Dropped() != 0 {
				t.Errorf("%d events dropped", tr.Dropped())
			}

			// Compute spans: every Acquire of every micro-batch and step.
			acq := 0
			for _, a := range e.order {
				if a.Kind == model.AccessAcquire {
					acq++
				}
			}
			count := map[string]int{}
			for _, ev := range evs {
				count[fmt.Sprint(ev.Rank, ev.Cat, ev.Tid)]++
			}
			for r := range e.n {
				if got, want := count[fmt.Sprint(r, TraceCompute, traceTidCompute)]-e.deviceAdamSpans(), steps*e.accum*acq; got != want {
					t.Errorf("rank %d: %d chunk compute spans, want %d", r, got, want)
				}
				if count[fmt.Sprint(r, TraceComm, traceTidComm)] == 0 {
					t.Errorf("rank %d: no collective on the comm stream", r)
				}
				if e.offload && count[fmt.Sprint(r, TraceAdam, traceTidAdam)] == 0 {
					t.Errorf("rank %d: no cpu adam span", r)
				}
				if got := count[fmt.Sprint(r, TraceOptimizer, traceTidOptimizer)]; got != steps {
					t.Errorf("rank %d: %d optimizer phases, want %d", r, got, steps)
				}
			}

			// Steps: one span each, in order, not overlapping.
			ov := Overlap(evs)
			if len(ov) != steps {
				t.Fatalf("%d steps in the timeline, want %d", len(ov), steps)
			}
			for i, o := range ov {
				if o.Step != int64(i+1) || o.Duration <= 0 || o.TransferBusy > o.Duration || o.Exposed > o.TransferBusy || o.Exposed > o.StallMax {
					t.Errorf("overlap %+v", o)
				}
				t.Log(o)
			}

			if e.tiers != nil {
				checkTierTrace(t, e, evs, before, after, stats, ov)
			}

			// The same run with the timeline off ends bit-identical.
			off := s.engine(t, nil)
			if err := off.Run(steps, nil); err != nil {
				t.Fatal(err)
			}
			pOn, err := e.Params()
			if err != nil {
				t.Fatal(err)
			}
			pOff, err := off.Params()
			if err != nil {
				t.Fatal(err)
			}
			if m, d := diff(pOn, pOff); m != 0 {
				t.Errorf("params with the timeline on: %d differ from the run without (max %g)", m, d)
			}
		})
	}
}

// deviceAdamSpans is the compute-stream spans per rank that are the device
// optimizer's, not chunks' (3 steps).
func (e *Engine) deviceAdamSpans() int {
	if e.offload {
		return 0
	}
	return 3 * len(e.chunks)
}

// checkTierTrace: moves and stalls against the store's and runners' counters.
func checkTierTrace(t *testing.T, e *Engine, evs []TraceEvent, before, after tier.Stats, stats []StepStats, ov []StepOverlap) {
	t.Helper()
	var traced, inSteps [shard.LinkCount]int64
	stallNs := make([]time.Duration, e.n)
	for _, ev := range evs {
		switch ev.Cat {
		case TraceMove:
			traced[ev.Link] += ev.Bytes
			if ev.Bytes <= 0 && ev.Args["error"] == nil {
				t.Errorf("move without bytes: %+v", ev)
			}
		case TraceStall:
			stallNs[ev.Rank] += ev.Dur
		}
	}
	var stepBytes [shard.LinkCount]int64
	for _, st := range stats {
		for l, b := range st.Tier.LinkBytes {
			stepBytes[l] += b
		}
	}
	for _, o := range ov {
		for l, b := range o.LinkBytes {
			inSteps[l] += b
		}
	}
	for l := range traced {
		if want := after.Links[l].Bytes - before.Links[l].Bytes; traced[l] != want {
			t.Errorf("%s: moves in the timeline carry %d B, the store counted %d B", shard.Link(l), traced[l], want)
		}
		if stepBytes[l] > 0 && traced[l] == 0 {
			t.Errorf("%s: StepStats count %d B, the timeline has no move", shard.Link(l), stepBytes[l])
		}
		if inSteps[l] > traced[l] {
			t.Errorf("%s: the steps' windows hold %d B of %d B", shard.Link(l), inSteps[l], traced[l])
		}
	}
	t.Logf("bytes per link: timeline %v, steps %v", traced, stepBytes)
	for r, d := range e.tiers.runners {
		_, st := d.stats()
		var sum time.Duration
		for _, v := range st {
			sum += v
		}
		if stallNs[r] != sum {
			t.Errorf("rank %d: shard waits in the timeline %v, the runner counted %v", r, stallNs[r], sum)
		}
	}
	if e.tiers.swap != nil && (traced[shard.NVMeToHost] == 0 || traced[shard.HostToNVMe] == 0) {
		t.Errorf("NVMe homes but no NVMe move: %v", traced)
	}
	if e.paramTier != shard.HBM && traced[shard.HostToHBM] == 0 {
		t.Errorf("params offloaded but no host->hbm move: %v", traced)
	}
}

// checkTraceJSON parses the Chrome trace and checks every event.
func checkTraceJSON(t *testing.T, js []byte) {
	t.Helper()
	var doc struct {
		TraceEvents []struct {
			Name string          `json:"name"`
			Ph   string          `json:"ph"`
			Ts   *float64        `json:"ts"`
			Dur  *float64        `json:"dur"`
			Pid  *int            `json:"pid"`
			Tid  *int            `json:"tid"`
			Args json.RawMessage `json:"args"`
		} `json:"traceEvents"`
		OtherData map[string]any `json:"otherData"`
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatalf("the trace is not JSON: %v", err)
	}
	type track struct{ pid, tid int }
	procs, threads := map[int]bool{}, map[track]bool{}
	for _, ev := range doc.TraceEvents {
		if ev.Ph == "M" && ev.Pid != nil && ev.Tid != nil {
			var a struct{ Name string }
			if err := json.Unmarshal(ev.Args, &a); err != nil {
				t.Fatal(err)
			}
			switch ev.Name {
			case "process_name":
				procs[*ev.Pid] = a.Name != ""
			case "thread_name":
				threads[track{*ev.Pid, *ev.Tid}] = a.Name != ""
			}
		}
	}
	spans := 0
	for _, ev := range doc.TraceEvents {
		switch {
		case ev.Name == "":
			t.Errorf("event without a name: %+v", ev)
		case ev.Pid == nil || ev.Tid == nil || ev.Ts == nil:
			t.Errorf("%q: no pid, tid or ts", ev.Name)
		case ev.Ph == "M":
		case ev.Ph != "X" && ev.Ph != "i":
			t.Errorf("%q: phase %q", ev.Name, ev.Ph)
		case !procs[*ev.Pid] || !threads[track{*ev.Pid, *ev.Tid}]:
			t.Errorf("%q: pid %d tid %d has no name", ev.Name, *ev.Pid, *ev.Tid)
		case ev.Ph == "X" && (ev.Dur == nil || *ev.Dur < 0 || *ev.Ts < 0):
			t.Errorf("%q: ts %v dur %v", ev.Name, *ev.Ts, ev.Dur)
		case ev.Ph == "X":
			spans++
		}
	}
	if spans == 0 {
		t.Error("no spans")
	}
}

// checkTracks: no two spans of one track overlap, in exact nanoseconds.
func checkTracks(t *testing.T, evs []TraceEvent) {
	t.Helper()
	type track struct{ pid, tid int }
	last := map[track]TraceEvent{}
	for _, ev := range evs { // sorted by start
		if ev.Phase != 'X' {
			continue
		}
		if ev.Dur < 0 || ev.Start < 0 {
			t.Errorf("%q: start %v dur %v", ev.Name, ev.Start, ev.Dur)
		}
		k := track{ev.Pid, ev.Tid}
		if p, ok := last[k]; ok && p.End() > ev.Start {
			t.Errorf("track %v: %q [%v, %v] overlaps %q [%v, %v]", k, p.Name, p.Start, p.End(), ev.Name, ev.Start, ev.End())
		}
		last[k] = ev
		if traceTidName(ev.Pid, ev.Tid) == "" {
			t.Errorf("%q: unknown track %v", ev.Name, k)
		}
	}
}

// TestTraceBounded: with MaxEvents reached the tracer keeps the first ones,
// counts the rest and says so in the JSON; a Tracer serves one engine.
func TestTraceBounded(t *testing.T) {
	if _, err := NewTracer(TraceOptions{MaxEvents: -1}); err == nil {
		t.Error("MaxEvents -1 accepted")
	}
	tr, err := NewTracer(TraceOptions{MaxEvents: 10})
	if err != nil {
		t.Fatal(err)
	}
	s := traceSpecs[3]
	e := s.engine(t, tr)
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := e.WriteTrace(&buf); err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, ev := range tr.Events() {
		if ev.Cat != TraceStep {
			kept++
		}
	}
	if kept != 10 || tr.Dropped() == 0 {
		t.Errorf("kept %d, dropped %d; want 10 kept and some dropped", kept, tr.Dropped())
	}
	if !strings.Contains(buf.String(), "trace truncated") {
		t.Error("the JSON does not say it is truncated")
	}
	checkTraceJSON(t, buf.Bytes())
	cfg := testConfig(t, s.run.configJSON())
	devs, comms, err := cpu.New(cpu.Options{Devices: s.run.n})
	if err != nil {
		t.Fatal(err)
	}
	if e2, err := New(cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), Trace: tr}); err == nil {
		e2.Close()
		t.Error("a second engine on one Tracer was accepted")
	} else {
		t.Log(err)
	}
	off := s.engine(t, nil)
	if err := off.WriteTrace(&buf); err == nil {
		t.Error("WriteTrace without a Tracer succeeded")
	}
}

// TestTraceAfterFault: a step that fails on an NVMe read error still
// leaves a timeline WriteTrace writes, with the failed move and its error.
func TestTraceAfterFault(t *testing.T) {
	nvmetest.Require(t)
	tr, err := NewTracer(TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	e := newTierEngine(t, s, Options{Trace: tr, NVMeDevice: func(d nvme.Device) nvme.Device {
		return nvme.NewFaulty(d, nvme.Fault{Kind: nvme.FaultEIO, Op: nvme.OpRead, Nth: 5})
	}})
	for range 5 {
		if _, err = e.Step(); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatal("no step failed")
	}
	var buf bytes.Buffer
	if werr := e.WriteTrace(&buf); werr != nil {
		t.Fatalf("write trace after the failed step (%v): %v", err, werr)
	}
	checkTraceJSON(t, buf.Bytes())
	failed := 0
	for _, ev := range tr.Events() {
		if ev.Cat == TraceMove && ev.Args["error"] != nil {
			failed++
		}
	}
	if failed == 0 {
		t.Error("the failed move is not in the timeline")
	}
}
