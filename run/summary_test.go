package run

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
)

// TestSummaryKeysSorted: summary.json, marshalled from Summary, has its
// keys in the order a map of them had when it was written from one (top
// level, "tier", "frozen", "host_optimizer": sorted); the per-device and
// registration objects keep their struct order, as before.
func TestSummaryKeysSorted(t *testing.T) {
	s := report.Summary{Model: "tiny", Params: 1234, Devices: 2, Stage: 3, Precision: gpu.F16, SkippedSteps: 1, LossScale: 1024,
		PerDevice:    []report.DeviceSummary{{Device: "cpu0", ModelStatePeakBytes: 5}},
		Tier:         &report.TierSummary{ParamTier: "host", OptimizerTier: "nvme", NVMePaths: []string{"/x"}},
		FrozenParams: 7, FrozenChunks: []string{"block 0"}, Notes: []string{"a note"},
		HostRegistration: []report.HostRegistration{{Pool: "pinned", Bytes: 4096, Outcome: "registered"}}}
	js := NewSummary(s, 1500*time.Millisecond)
	loss, tokens := 2.5, int64(99)
	js.EvalLoss, js.EvalTokens, js.MeasuredStepSeconds, js.PredictedStepSecs, js.PredictedBy = &loss, &tokens, 0.25, 0.3, "strata plan, profile p"
	// A run has one or the other; both set, every optional key is here.
	stepErr := 0.2
	js.StepTimeError, js.PredictionNote = &stepErr, "no profile at p"
	b, err := json.MarshalIndent(js, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	top := objectKeys(t, b)
	if len(top) != 32 {
		t.Errorf("%d keys, want 32 (every optional one set): %v", len(top), top)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for what, keys := range map[string][]string{"summary.json": top, "tier": objectKeys(t, m["tier"]),
		"frozen": objectKeys(t, m["frozen"]), "host_optimizer": objectKeys(t, m["host_optimizer"])} {
		if !slices.IsSorted(keys) {
			t.Errorf("%s: keys not sorted: %v", what, keys)
		}
	}
}

// objectKeys are the keys of the JSON object b, in their order.
func objectKeys(t *testing.T, b []byte) []string {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", b)
	}
	var keys []string
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestSummaryRelocations: the summary says when the store moved idle host
// copies to make a free run in a fragmented pool, and is silent otherwise.
func TestSummaryRelocations(t *testing.T) {
	ts := report.TierSummary{ParamTier: "nvme", OptimizerTier: "nvme", PinnedPoolBytes: 10 << 30, PinnedPeakBytes: 9 << 30}
	if s := formatTiers(ts); bytes.Contains([]byte(s), []byte("moved to unfragment")) {
		t.Errorf("no relocation, yet: %s", s)
	}
	ts.PinnedRelocations, ts.PinnedRelocatedBytes = 3, 700<<20
	if s := formatTiers(ts); !bytes.Contains([]byte(s), []byte("(pinned pool 9.00 GiB/10.00 GiB; 3 idle copies, 700.0 MiB, moved to unfragment it)")) {
		t.Errorf("the relocations are not said: %s", s)
	}
	js := newTierSummary(&ts)
	if js.PinnedRelocations != 3 || js.PinnedRelocatedBytes != 700<<20 {
		t.Errorf("summary.json: %d relocations of %d B", js.PinnedRelocations, js.PinnedRelocatedBytes)
	}
}
