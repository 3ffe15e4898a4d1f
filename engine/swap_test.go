package engine

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// newTierEngineJSON is newTierEngine with the config given.
func newTierEngineJSON(t *testing.T, s tierSpec, js string) *Engine {
	t.Helper()
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e, err := startEngine(t, testConfig(t, js), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2})
	if err != nil {
		t.Fatalf("%v: %v", s, err)
	}
	return e
}

func swapFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.swap"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestTierTwoRunsOnOneNVMePath: two engines train at the same time with
// params and optimizer state on one nvme_path (two runs sharing a
// DeepSpeed config); each has its own swap file, and both end with params,
// master weights and losses bit-identical to a lone run. Close removes both
// files. Before each run had its own file, the second overwrote the first's
// (a crc32c "data lost" error).
func TestTierTwoRunsOnOneNVMePath(t *testing.T) {
	nvmetest.Require(t)
	s := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	const steps = 6
	lone, _ := runTier(t, s, Options{}, steps)
	dir := nvmetest.Dir(t)
	var engines [2]*Engine
	for i := range engines {
		engines[i] = newTierEngineJSON(t, s, s.configJSON(dir))
	}
	if got := swapFiles(t, dir); len(got) != 2 {
		t.Fatalf("two runs on %s: swap files %v, want two", dir, got)
	}
	var runs [2]tierRun
	var errs [2]error
	var wg sync.WaitGroup
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.Run(t.Context(), steps, func(st report.StepStats) error {
				runs[i].losses = append(runs[i].losses, st.Loss)
				return nil
			})
		}()
	}
	wg.Wait()
	for i, e := range engines {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		var err error
		if runs[i].params, err = e.Params(); err != nil {
			t.Fatal(err)
		}
		if runs[i].master, err = e.Master(); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(runs[i].losses, lone.losses) || !reflect.DeepEqual(runs[i].params, lone.params) || !reflect.DeepEqual(runs[i].master, lone.master) {
			t.Fatalf("run %d on a shared nvme_path differs from a lone run: losses %v, want %v", i, runs[i].losses, lone.losses)
		}
	}
	for _, e := range engines {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := swapFiles(t, dir); len(got) != 0 {
		t.Fatalf("swap files left after Close: %v", got)
	}
}

// TestTierNVMePathSpelledTwice: offload_param's nvme_path "/x" and
// offload_optimizer's "/x/" (or a relative spelling) are one directory: one
// swap file there, a note naming both spellings, and training that equals
// the run with one spelling.
func TestTierNVMePathSpelledTwice(t *testing.T) {
	nvmetest.Require(t)
	s := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	const steps = 4
	lone, _ := runTier(t, s, Options{}, steps)
	dir := nvmetest.Dir(t)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{dir + "/", rel} {
		js := s.configJSON(dir)
		i := strings.LastIndex(js, `"nvme_path": "`+dir+`"`)
		js = js[:i] + `"nvme_path": "` + other + `"` + js[i+len(`"nvme_path": "`+dir+`"`):]
		e := newTierEngineJSON(t, s, js)
		if got := swapFiles(t, dir); len(got) != 1 {
			t.Fatalf("nvme_path %s and %s: swap files %v, want one", dir, other, got)
		}
		if !strings.Contains(strings.Join(e.Notes(), "\n"), "are one directory") {
			t.Errorf("no note on two spellings of one directory: %q", e.Notes())
		}
		var losses []float64
		if err := e.Run(t.Context(), steps, func(st report.StepStats) error { losses = append(losses, st.Loss); return nil }); err != nil {
			t.Fatalf("nvme_path %s and %s: %v", dir, other, err)
		}
		params, err := e.Params()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(losses, lone.losses) || !reflect.DeepEqual(params, lone.params) {
			t.Fatalf("nvme_path %s and %s: differs from one spelling: losses %v, want %v", dir, other, losses, lone.losses)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

const swapChildEnv = "STRATA_ENGINE_SWAP_CHILD"

// runDigest is a digest of a run's losses, params and master weights: equal
// digests are bit-identical runs.
func runDigest(r tierRun) string {
	h := sha256.New()
	for _, l := range r.losses {
		binary.Write(h, binary.LittleEndian, math.Float64bits(l))
	}
	for _, xs := range append(append([][]float32(nil), r.params...), r.master...) {
		for _, x := range xs {
			binary.Write(h, binary.LittleEndian, math.Float32bits(x))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestTierTwoProcessesOnOneNVMePath: two processes (this test binary,
// re-executed) open engines on one nvme_path, both hold their swap files at
// once, then train together; each ends bit-identical to a lone run in this
// process, and each removed its own file at exit.
func TestTierTwoProcessesOnOneNVMePath(t *testing.T) {
	s := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	const steps = 6
	if dir := os.Getenv(swapChildEnv); dir != "" {
		swapChild(t, s, dir, steps)
		return
	}
	nvmetest.Require(t)
	lone, _ := runTier(t, s, Options{}, steps)
	want := runDigest(lone)
	dir := nvmetest.Dir(t)
	type child struct {
		cmd *exec.Cmd
		in  *os.File
		out *bufio.Reader
	}
	var kids []child
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestTierTwoProcessesOnOneNVMePath$")
		cmd.Env = append(os.Environ(), swapChildEnv+"="+dir)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = r
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		kids = append(kids, child{cmd, w, bufio.NewReader(out)})
	}
	readLine := func(k child, prefix string) string {
		var skipped []string // the child's test output: its failure, if any
		for {
			line, err := k.out.ReadString('\n')
			if err != nil {
				t.Fatalf("child %d: waiting for %q: %v; it said:\n%s", k.cmd.Process.Pid, prefix, err, strings.Join(skipped, ""))
			}
			skipped = append(skipped, line)
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				return strings.TrimSpace(rest)
			}
		}
	}
	for _, k := range kids {
		readLine(k, "ready")
	}
	if got := swapFiles(t, dir); len(got) != 2 {
		t.Fatalf("two processes on %s: swap files %v, want two", dir, got)
	}
	for _, k := range kids {
		fmt.Fprintln(k.in, "go")
		k.in.Close()
	}
	for i, k := range kids {
		if got := readLine(k, "digest "); got != want {
			t.Errorf("process %d on a shared nvme_path: digest %s, want the lone run's %s", i, got, want)
		}
		if err := k.cmd.Wait(); err != nil {
			t.Errorf("process %d: %v", i, err)
		}
	}
	if got := swapFiles(t, dir); len(got) != 0 {
		t.Fatalf("swap files left after both processes exited: %v", got)
	}
}

// swapChild opens an engine on dir, says "ready", trains once the parent
// says "go" (on stdin), and prints the run's digest.
func swapChild(t *testing.T, s tierSpec, dir string, steps int) {
	e := newTierEngineJSON(t, s, s.configJSON(dir))
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("waiting for go: %v", err)
	}
	var r tierRun
	if err := e.Run(t.Context(), steps, func(st report.StepStats) error { r.losses = append(r.losses, st.Loss); return nil }); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if r.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("digest " + runDigest(r))
}
