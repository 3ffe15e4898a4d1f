package engine

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// fakeRegistrar records what the engine's pinned pools hand a device
// backend (as gpu/cuda's HostRegistrar would page-lock it).
type fakeRegistrar struct {
	mu   sync.Mutex
	live map[*byte]int
	adds int
	fail bool
}

func (f *fakeRegistrar) Register(i int, mem []byte) error {
	if f.fail {
		return errors.New("cuMemHostRegister: out of memory")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[&mem[0]] = len(mem)
	f.adds++
	return nil
}

func (f *fakeRegistrar) Unregister(i int, mem []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[&mem[0]]; !ok {
		return errors.New("not registered")
	}
	delete(f.live, &mem[0])
	return nil
}

// TestHostRegistrar: with the host optimizer every pinned arena is
// registered at New and unregistered at Close; a registrar that fails
// leaves a note and a working engine, bit-identical to one without.
func TestHostRegistrar(t *testing.T) {
	s := runSpec{stage: 2, n: 2, offload: true, micro: 2, accum: 1, clip: 1}
	run := func(reg *fakeRegistrar) ([][]float32, []string) {
		t.Helper()
		devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		opts := Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2}
		if reg != nil {
			opts.HostRegistrar = reg
		}
		e, err := startEngine(t, testConfig(t, s.configJSON()), cpu.Devices(devs), comms, opts)
		if err != nil {
			t.Fatal(err)
		}
		if reg != nil && !reg.fail && (reg.adds == 0 || len(reg.live) != reg.adds) {
			t.Errorf("registered %d arenas, %d live", reg.adds, len(reg.live))
		}
		if err := e.Run(t.Context(), 3, nil); err != nil {
			t.Fatal(err)
		}
		p, err := e.Params()
		if err != nil {
			t.Fatal(err)
		}
		notes := e.Notes()
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if reg != nil && len(reg.live) != 0 {
			t.Errorf("%d arenas still registered after Close", len(reg.live))
		}
		return p, notes
	}
	want, _ := run(nil)
	for _, reg := range []*fakeRegistrar{{live: map[*byte]int{}}, {live: map[*byte]int{}, fail: true}} {
		got, notes := run(reg)
		if n, _ := diff(got, want); n != 0 {
			t.Errorf("fail=%v: %d params differ from the run without a registrar", reg.fail, n)
		}
		joined := strings.Join(notes, "\n")
		if reg.fail != strings.Contains(joined, "not registered with the devices") {
			t.Errorf("fail=%v: notes:\n%s", reg.fail, joined)
		}
	}
}
