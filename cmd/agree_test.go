package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/mpitest"
)

// mpiStrataEach starts a job of len(args) processes, process q running
// `strata args[q]...` (env added to every process), and returns mpirun's
// output and error once it ends.
func mpiStrataEach(t *testing.T, env []string, args ...[]string) (string, error) {
	t.Helper()
	mpitest.Need(t)
	for q, a := range args {
		b, _ := json.Marshal(a)
		name := "STRATA_TEST_MAIN"
		if q > 0 {
			name = fmt.Sprintf("STRATA_TEST_MAIN_P%d", q)
		}
		env = append(env, name+"="+string(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := mpitest.Command(ctx, len(args), env, os.Args[0]).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the job did not end in 2 minutes:\n%s", out)
	}
	return string(out), err
}

// TestJobStartAgreement: processes of one job that resolve different runs
// (a flag outside the config, another data file behind the same name, an
// --out of their own), or one of which fails at start-up, end the job
// before its first step — where they hung in a collective or trained
// apart before — with one line, printed by process 0, naming the process
// and the difference; nothing is trained or written.
func TestJobStartAgreement(t *testing.T) {
	cfg := jobConfig(t, 3, "none", "cpu", "")
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	corpus := writeFile(t, "corpus.txt", string(text))
	held := writeFile(t, "held.txt", strings.Repeat("held out text. ", 60))
	// d.txt in two working directories, with other contents.
	dirA, dirB := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(dirA, "d.txt"), text, 0o644)
	os.WriteFile(filepath.Join(dirB, "d.txt"), append(text, "one more line\n"...), 0o644)
	for _, c := range []struct {
		name   string
		p0, p1 []string
		env    []string
		want   string
	}{
		{"missing data", []string{"--data", corpus}, []string{"--data", filepath.Join(t.TempDir(), "nosuch.txt")}, nil,
			`process 1 of 2 failed at start-up: --data: .*nosuch.txt: no such file`},
		{"save-every", []string{"--save-every", "5", "--keep", "2"}, []string{"--save-every", "10"}, nil, // --keep 2 is the default: no difference
			`process 1 resolved another run than process 0: --save-every 10 \(process 0: 5\)`},
		{"eval-data on one", nil, []string{"--eval-data", held}, nil,
			`process 1 resolved another run than process 0: --eval-data .*held.txt \(\d+ bytes, sha256 [0-9a-f]+\) \(process 0: \(not given\)\)`},
		{"no-shuffle on one", []string{"--data", corpus}, []string{"--data", corpus, "--no-shuffle"}, nil,
			`process 1 resolved another run than process 0: --no-shuffle true \(process 0: false\)`},
		{"same name, other file", []string{"--data", "d.txt"}, []string{"--data", "d.txt"}, []string{"STRATA_TEST_DIR_P0=" + dirA, "STRATA_TEST_DIR_P1=" + dirB},
			`process 1 resolved another run than process 0: training data \S*/d.txt \(\d+ bytes, sha256 [0-9a-f]+\) \(process 0: \S*/d.txt \(\d+ bytes`},
		{"out of its own", nil, []string{"--out", filepath.Join(t.TempDir(), "other")}, nil,
			`process 1 resolved another run than process 0: --out .*other \(process 0: .*run\)`},
	} {
		out := filepath.Join(t.TempDir(), "run")
		base := []string{"train", "--config", cfg, "--devices", "2", "--steps", "20", "--no-progress", "--out", out}
		p1 := append(slices.Clone(base), c.p1...)
		if i := slices.Index(c.p1, "--out"); i >= 0 {
			p1 = append(slices.Clone(base[:len(base)-2]), c.p1...)
		}
		start := time.Now()
		log, err := mpiStrataEach(t, c.env, append(slices.Clone(base), c.p0...), p1)
		took := time.Since(start)
		if err == nil {
			t.Errorf("%s: the job ended well:\n%s", c.name, log)
			continue
		}
		if !regexp.MustCompile(c.want).MatchString(log) {
			t.Errorf("%s: no line matching %q:\n%s", c.name, c.want, log)
		}
		if n := strings.Count(log, "strata train: "); n != 1 {
			t.Errorf("%s: %d lines of strata train's errors, want 1:\n%s", c.name, n, log)
		}
		if _, err := os.Stat(filepath.Join(out, "steps.jsonl")); err == nil {
			t.Errorf("%s: the job trained (steps.jsonl written)", c.name)
		}
		if took > time.Minute {
			t.Errorf("%s: the job took %s to end", c.name, took)
		}
	}
}

// TestJobFailureEndsJob: a process that fails mid-run (an error of its
// own, here injected after its third step) ends every process of the job
// within 10 s (MPI_Abort), where its peers waited for it in their next
// collective and it for them in MPI_Finalize; its error is printed, and the
// latest checkpoint stays whole.
func TestJobFailureEndsJob(t *testing.T) {
	cfg := jobConfig(t, 3, "none", "cpu", "")
	out := filepath.Join(t.TempDir(), "run")
	cmd, log := startJobEnv(t, []string{"STRATA_TEST_FAIL_P1=step#3"}, cfg, out, 0, "--save-every", "2")
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	var failedAt time.Time
	for failedAt.IsZero() {
		select {
		case err := <-ended:
			if !strings.Contains(log.String(), "injected failure at step #3") {
				t.Fatalf("the job ended (%v) before the failure:\n%s", err, log.String())
			}
			failedAt = time.Now()
			ended <- err
		case <-time.After(10 * time.Millisecond):
			if strings.Contains(log.String(), "injected failure at step #3") {
				failedAt = time.Now()
			}
		}
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatalf("the job ended well after a process failed:\n%s", log.String())
		}
		t.Logf("ended %s after the failure", time.Since(failedAt).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("the job did not end within 10 s of a process's failure:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "strata train: injected failure at step #3") {
		t.Errorf("the failing process's error is not printed:\n%s", log.String())
	}
}

// TestMpirunOptions: the command that goes on with a job repeats mpirun's
// options, read from its argv up to the program; another parent, or an
// MPMD job (":"), gives "" (the caller falls back to "mpirun -np P").
func TestMpirunOptions(t *testing.T) {
	for _, c := range []struct {
		argv []string
		prog string
		want string
	}{
		{[]string{"mpirun", "-np", "2", "--hostfile", "my hosts", "./strata", "train"}, "./strata", "mpirun -np 2 --hostfile 'my hosts'"},
		{[]string{"/usr/bin/mpiexec", "-n", "4", "/opt/bin/strata", "train"}, "strata", "/usr/bin/mpiexec -n 4"},
		{[]string{"bash", "-c", "strata train"}, "strata", ""},
		{[]string{"mpirun", "-np", "1", "strata", ":", "-np", "1", "strata"}, "strata", ""},
		{[]string{"mpirun", "-np", "2", "other"}, "strata", ""},
	} {
		if got := mpirunOptions(c.argv, c.prog); got != c.want {
			t.Errorf("%q: %q, want %q", c.argv, got, c.want)
		}
	}
}
