package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
	"github.com/strata-ai/strata/timeline"
)

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

func (s traceSpec) engine(t *testing.T, tr *timeline.Tracer) *Engine {
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
			tr, err := timeline.NewTracer(timeline.Options{})
			if err != nil {
				t.Fatal(err)
			}
			e := s.engine(t, tr)
			var before tier.Stats
			if e.tiers != nil {
				before = e.tiers.store.Stats()
			}
			var stats []report.StepStats
			if err := e.Run(t.Context(), steps, func(st report.StepStats) error { stats = append(stats, st); return nil }); err != nil {
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
				if got, want := count[fmt.Sprint(r, timeline.CatCompute, timeline.TidCompute)]-e.deviceAdamSpans(), steps*e.accum*acq; got != want {
					t.Errorf("rank %d: %d chunk compute spans, want %d", r, got, want)
				}
				if count[fmt.Sprint(r, timeline.CatComm, timeline.TidComm)] == 0 {
					t.Errorf("rank %d: no collective on the comm stream", r)
				}
				if e.offload && count[fmt.Sprint(r, timeline.CatAdam, timeline.TidAdam)] == 0 {
					t.Errorf("rank %d: no cpu adam span", r)
				}
				if got := count[fmt.Sprint(r, timeline.CatOptimizer, timeline.TidOptimizer)]; got != steps {
					t.Errorf("rank %d: %d optimizer phases, want %d", r, got, steps)
				}
			}

			// Steps: one span each, in order, not overlapping.
			ov := timeline.Overlap(evs)
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
			if err := off.Run(t.Context(), steps, nil); err != nil {
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
func checkTierTrace(t *testing.T, e *Engine, evs []timeline.Event, before, after tier.Stats, stats []report.StepStats, ov []timeline.StepOverlap) {
	t.Helper()
	var traced, inSteps [shard.LinkCount]int64
	stallNs := make([]time.Duration, e.n)
	for _, ev := range evs {
		switch ev.Cat {
		case timeline.CatMove:
			traced[ev.Link] += ev.Bytes
			if ev.Bytes <= 0 && ev.Args["error"] == nil {
				t.Errorf("move without bytes: %+v", ev)
			}
		case timeline.CatStall, timeline.CatOptWait:
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
			t.Errorf("%s: report.StepStats count %d B, the timeline has no move", shard.Link(l), stepBytes[l])
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
func checkTracks(t *testing.T, evs []timeline.Event) {
	t.Helper()
	type track struct{ pid, tid int }
	last := map[track]timeline.Event{}
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
		if timeline.TrackName(ev.Pid, ev.Tid) == "" {
			t.Errorf("%q: unknown track %v", ev.Name, k)
		}
	}
}

// TestTraceBounded: with MaxEvents reached the tracer keeps the first ones,
// counts the rest and says so in the JSON; a Tracer serves one engine.
func TestTraceBounded(t *testing.T) {
	if _, err := timeline.NewTracer(timeline.Options{MaxEvents: -1}); err == nil {
		t.Error("MaxEvents -1 accepted")
	}
	tr, err := timeline.NewTracer(timeline.Options{MaxEvents: 10})
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
		if ev.Cat != timeline.CatStep {
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
		t.Error("a second engine on one timeline.Tracer was accepted")
	} else {
		t.Log(err)
	}
	off := s.engine(t, nil)
	if err := off.WriteTrace(&buf); err == nil {
		t.Error("WriteTrace without a timeline.Tracer succeeded")
	}
}

// TestTraceAfterFault: a step that fails on an NVMe read error still
// leaves a timeline WriteTrace writes, with the failed move and its error.
func TestTraceAfterFault(t *testing.T) {
	nvmetest.Require(t)
	tr, err := timeline.NewTracer(timeline.Options{})
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
		if ev.Cat == timeline.CatMove && ev.Args["error"] != nil {
			failed++
		}
	}
	if failed == 0 {
		t.Error("the failed move is not in the timeline")
	}
}
