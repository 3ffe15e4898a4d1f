package engine

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/dist"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/mpitest"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestProcs: a job of P processes × L devices (Open MPI, mpirun) trains
// bit for bit as one process of N = P·L devices — losses, gradient norms,
// params and master weights — at stages 0-3, with the optimizer on the
// device, on the host, and params and optimizer on NVMe; a checkpoint the
// job saves half way resumes in one process of N devices (1×N) to the
// uninterrupted run's bits. 2×2 and 4×1.
func TestProcs(t *testing.T) {
	if mpitest.Child() {
		t.Skip("the parent's test")
	}
	dir := nvmetest.Dir(t) // shared by the processes: the config names it
	for _, c := range []struct{ np, local int }{{2, 2}, {4, 1}} {
		mpitest.Run(t, c.np, "TestProcsChild", "STRATA_TEST_LOCAL="+strconv.Itoa(c.local), "STRATA_TEST_DIR="+dir)
	}
}

// procCase is one configuration of TestProcsChild.
type procCase struct {
	stage      int
	param, opt string
	nvme       bool // only in the 2×2 job (4 processes on 2 cores are slow)
	// fp32 trains in fp32: its gradients' sums depend on their order (a
	// bf16 run's four-term fp32 sums of bf16 values are nearly always exact).
	fp32 bool
	// narrow keeps int8 moments and a bf16+remainder master.
	narrow bool
}

func TestProcsChild(t *testing.T) {
	if !mpitest.Child() {
		t.Skip("runs under mpirun (TestProcs)")
	}
	m, err := dist.OpenMPI()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	local, _ := strconv.Atoi(os.Getenv("STRATA_TEST_LOCAL"))
	base := os.Getenv("STRATA_TEST_DIR")
	n := m.Procs() * local
	cases := []procCase{
		{stage: 0, param: "none", opt: "none"},
		{stage: 1, param: "none", opt: "none"},
		{stage: 2, param: "none", opt: "none", fp32: true},
		{stage: 2, param: "none", opt: "cpu"},
		{stage: 3, param: "none", opt: "none"},
		{stage: 3, param: "cpu", opt: "cpu"},
		{stage: 3, param: "cpu", opt: "cpu", narrow: true},
		{stage: 3, param: "nvme", opt: "nvme", nvme: true},
	}
	for i, c := range cases {
		if c.nvme && local == 1 {
			continue
		}
		name := fmt.Sprintf("%d×%d/stage%d/param-%s/opt-%s", m.Procs(), local, c.stage, c.param, c.opt)
		s := tierSpec{n: n, param: c.param, opt: c.opt, stage: c.stage, hostBudget: 64 << 20}
		if c.narrow {
			s.strata = `"optimizer_state": {"moments": "int8", "master": "bf16+remainder"}, `
			name += "/int8+remainder"
		}
		if c.stage == 0 {
			s.stage = 0 // tierSpec's 0 is stage 3: set it below
		}
		js := s.configJSON(base)
		if c.stage == 0 {
			js = strings.Replace(js, `"stage": 3,`, `"stage": 0,`, 1)
		}
		ckdir := filepath.Join(base, fmt.Sprintf("ckpt-%d-%d-%d", m.Procs(), local, i))
		const steps, half = 6, 3
		prec := gpu.BF16
		if c.fp32 {
			prec = gpu.F32
			name += "/fp32"
		}
		got := runProcs(t, js, local, m, steps, half, ckdir, prec)
		want := runProcs(t, js, n, nil, steps, 0, "", prec)
		if c.opt == "nvme" && got.pool != want.pool/int64(m.Procs()) {
			t.Errorf("%s: pinned pool %d bytes, want the node's host budget (%d) over its %d processes", name, got.pool, want.pool, m.Procs())
		}
		compareRuns(t, name, got, want)
		// The job's checkpoint of step 3 in one process of N devices.
		res := resumeProcs(t, js, n, ckdir, steps-half, prec)
		compareRuns(t, name+" resumed 1×N", res, want)
	}
	// The last process given another seed: New fails in every process,
	// naming it, before anything is allocated.
	js := tierSpec{n: n, param: "none", opt: "none"}.configJSON("")
	if m.Proc() == m.Procs()-1 {
		js = strings.Replace(js, fmt.Sprintf(`"seed": %d`, testSeed), `"seed": 99`, 1)
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: local, HBMBytes: 64 << 20, Net: m})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(testConfig(t, js), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), Procs: m})
	if want := fmt.Sprintf("process %d's resolved config differs from process 0's", m.Procs()-1); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("process %d: another config in process %d: %v", m.Proc(), m.Procs()-1, err)
	}
	fmt.Printf("procs child ok: process %d of %d\n", m.Proc(), m.Procs())
}

type procRun struct {
	losses, norms  []float64
	params, master [][]float32
	pool           int64 // the tier store's pinned pool
}

// runProcs runs steps steps on local devices of the job procs (nil: one
// process), saving a checkpoint to ckdir after step half (0: none).
func runProcs(t *testing.T, js string, local int, procs *dist.MPI, steps, half int, ckdir string, prec gpu.DType) procRun {
	t.Helper()
	cfg := testConfig(t, js)
	o := cpu.Options{Devices: local, HBMBytes: 256 << 20}
	opts := Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Precision: prec}
	if procs != nil {
		opts.NodeProcs = procs.Procs() // all on this machine: they share its host budget
		// The devices' rounds on a communicator of their own (cmd's job
		// does the same): no order relates them to the host's exchanges.
		net, err := procs.Dup()
		if err != nil {
			t.Fatal(err)
		}
		defer net.Close()
		o.Net, opts.Procs = net, procs
	}
	devs, comms, err := cpu.New(o)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, cpu.Devices(devs), comms, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var r procRun
	err = e.Run(t.Context(), steps, func(st report.StepStats) error {
		r.losses, r.norms = append(r.losses, st.Loss), append(r.norms, st.GradNorm)
		if int(st.Step) == half {
			if _, err := e.SaveCheckpoint(ckdir, checkpoint.Options{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if r.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	if ts := e.Summary().Tier; ts != nil {
		r.pool = ts.PinnedPoolBytes
	}
	return r
}

// resumeProcs loads ckdir into one process of n devices and runs steps.
func resumeProcs(t *testing.T, js string, n int, ckdir string, steps int, prec gpu.DType) procRun {
	t.Helper()
	cfg := testConfig(t, js)
	devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Precision: prec})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.LoadCheckpoint(ckdir); err != nil {
		t.Fatal(err)
	}
	var r procRun
	// The losses before the checkpoint are the job's: pad with them.
	if err := e.Run(t.Context(), steps, func(st report.StepStats) error {
		r.losses, r.norms = append(r.losses, st.Loss), append(r.norms, st.GradNorm)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if r.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return r
}

func compareRuns(t *testing.T, name string, got, want procRun) {
	t.Helper()
	wl, wn := want.losses[len(want.losses)-len(got.losses):], want.norms[len(want.norms)-len(got.norms):]
	for i := range got.losses {
		if math.Float64bits(got.losses[i]) != math.Float64bits(wl[i]) || math.Float64bits(got.norms[i]) != math.Float64bits(wn[i]) {
			t.Errorf("%s: step %d of the last %d: loss %v norm %v, one process %v %v", name, i+1, len(got.losses), got.losses[i], got.norms[i], wl[i], wn[i])
		}
	}
	for what, pair := range map[string][2][][]float32{"params": {got.params, want.params}, "master": {got.master, want.master}} {
		if bad, maxAbs := diff(pair[0], pair[1]); bad > 0 {
			t.Errorf("%s: %s: %d values differ from one process's (max |Δ| %g)", name, what, bad, maxAbs)
		}
	}
}
