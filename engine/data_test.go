package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// errInjected is the read error faultyCorpus returns.
var errInjected = errors.New("injected read error")

// faultyCorpus is a corpus whose reads fail while fail is set.
type faultyCorpus struct {
	model.Corpus
	fail  atomic.Bool
	reads atomic.Int64
}

func (c *faultyCorpus) Read(off int64, dst []int32) error {
	c.reads.Add(1)
	if c.fail.Load() {
		return fmt.Errorf("data at offset %d: %w", off, errInjected)
	}
	return c.Corpus.Read(off, dst)
}

// dataRun trains steps steps of s with opts' corpus and returns the losses,
// the params and the master weights; fn, when not nil, runs before each
// step and may make it fail (fail says whether it must).
func dataRun(t *testing.T, s runSpec, opts Options, steps int, fn func(step int) (fail bool)) result {
	t.Helper()
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	opts.OptimizerThreads = 2
	e, err := startEngine(t, testConfig(t, s.configJSON()), cpu.Devices(devs), comms, opts)
	if err != nil {
		t.Fatal(err)
	}
	var res result
	for e.StepCount() < int64(steps) {
		next := int(e.StepCount()) + 1
		fail := fn != nil && fn(next)
		st, err := stepWithin(t, e)
		if fail {
			if !errors.Is(err, errInjected) {
				t.Fatalf("step %d with failing reads: %v, want the read error", next, err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, fmt.Sprintf("engine: step %d: rank 0 micro-batch 0: data at offset ", next)) || strings.Count(msg, "engine:") != 1 {
				t.Errorf("step %d: %q does not name the step, the rank and the offset once", next, msg)
			}
			if e.StepCount() != int64(next-1) {
				t.Fatalf("a failed step counted: step count %d", e.StepCount())
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v", next, err)
		}
		res.losses = append(res.losses, st.Loss)
	}
	if res.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if res.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return res
}

func sameResult(t *testing.T, what string, got, want result) {
	t.Helper()
	if !slices.Equal(got.losses, want.losses) {
		t.Errorf("%s: losses %v, want %v", what, got.losses, want.losses)
	}
	if n, d := diff(got.params, want.params); n != 0 {
		t.Errorf("%s: %d params differ (max %g)", what, n, d)
	}
	if n, d := diff(got.master, want.master); n != 0 {
		t.Errorf("%s: %d master weights differ (max %g)", what, n, d)
	}
}

// TestDataReadError: a corpus read that fails ends the step with an error
// naming the step, the rank and the offset, before any rank ran (ZeRO-3 on
// 2 devices with the host optimizer under the next step: nothing hangs,
// nothing is counted); the step retried once reads work again, the run
// ends bit-identical to one that never failed.
func TestDataReadError(t *testing.T) {
	s := runSpec{stage: 3, n: 2, offload: true, micro: 2, accum: 2}
	want := dataRun(t, s, Options{Corpus: model.Tokens(testTokens)}, 4, nil)
	fc := &faultyCorpus{Corpus: model.Tokens(testTokens)}
	tries := map[int]int{}
	got := dataRun(t, s, Options{Corpus: fc}, 4, func(step int) bool {
		tries[step]++
		fail := (step == 1 || step == 3) && tries[step] == 1
		fc.fail.Store(fail)
		return fail
	})
	sameResult(t, "a run with failed reads at steps 1 and 3", got, want)
	if fc.reads.Load() == 0 {
		t.Fatal("the corpus was never read")
	}
}

// TestDataFile: strata.data is streamed from the file (the engine opens
// it, and closes it with Close: startEngine's leak check sees every
// descriptor closed), and trains bit-identical to the same bytes in memory.
func TestDataFile(t *testing.T) {
	text := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 300))
	path := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	s := runSpec{stage: 2, n: 2, offload: true, micro: 2, accum: 1}
	want := dataRun(t, s, Options{Corpus: model.Tokens(model.Encode(text))}, 3, nil)

	js := strings.Replace(s.configJSON(), `"strata": {`, fmt.Sprintf(`"strata": {"data": %q, `, path), 1)
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e, err := startEngine(t, testConfig(t, js), cpu.Devices(devs), comms, Options{OptimizerThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Sampler().Corpus().(*model.FileCorpus); !ok {
		t.Fatalf("strata.data is read as %T, not streamed from the file", e.Sampler().Corpus())
	}
	var got result
	if err := e.Run(t.Context(), 3, func(st report.StepStats) error { got.losses = append(got.losses, st.Loss); return nil }); err != nil {
		t.Fatal(err)
	}
	if got.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if got.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	sameResult(t, "strata.data streamed", got, want)

	// What is not a regular file is refused at New, naming it.
	for _, bad := range []string{"/dev/zero", t.TempDir()} {
		js := strings.Replace(s.configJSON(), `"strata": {`, fmt.Sprintf(`"strata": {"data": %q, `, bad), 1)
		_, err := New(testConfig(t, js), cpu.Devices(devs), comms, Options{})
		if !errors.Is(err, model.ErrNotRegular) || !strings.Contains(err.Error(), bad) {
			t.Errorf("strata.data %s: %v, want ErrNotRegular naming it", bad, err)
		}
	}
}

// TestDataVocab: a corpus read in windows has each batch checked against
// the vocabulary: a token outside it ends the step with an error.
func TestDataVocab(t *testing.T) {
	tokens := slices.Clone(testTokens)
	for i := range tokens {
		tokens[i] = 300 // outside the test shape's 256
	}
	fc := &faultyCorpus{Corpus: model.Tokens(tokens)}
	devs, comms, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// model.Tokens given as Corpus is checked whole at New.
	s := runSpec{stage: 0, n: 1, micro: 1, accum: 1}
	if _, err := New(testConfig(t, s.configJSON()), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(tokens)}); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Fatalf("New with out-of-vocabulary Tokens: %v", err)
	}
	e, err := startEngine(t, testConfig(t, s.configJSON()), cpu.Devices(devs), comms, Options{Corpus: fc})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Step(); err == nil || !strings.Contains(err.Error(), "(id 300) is outside the vocabulary [0, 256)") {
		t.Fatalf("step on out-of-vocabulary tokens: %v", err)
	}
}
