// Package mpitest runs a test binary's own test under mpirun, for the
// tests of several packages that need processes of one MPI job (Open MPI
// from Debian's openmpi-bin; .ci/run installs it, and a machine without it
// fails these tests, naming the package to install).
package mpitest

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EnvChild is set in the processes Run starts: a test that sees it is a
// child and does the MPI side of its work.
const EnvChild = "STRATA_MPITEST_CHILD"

// Child reports whether this process is one of Run's children.
func Child() bool { return os.Getenv(EnvChild) != "" }

// Command is mpirun starting np copies of args with env added, allowed to
// run as root (a container's user) and to put more processes than cores
// on this machine.
func Command(ctx context.Context, np int, env []string, args ...string) *exec.Cmd {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		mpirun = "mpirun"
	}
	cmd := exec.CommandContext(ctx, mpirun, append([]string{"-np", strconv.Itoa(np), "--oversubscribe", "--bind-to", "none"}, args...)...)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_btl_vader_single_copy_mechanism=none")
	cmd.Env = append(cmd.Env, env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Need fails t when mpirun is missing.
func Need(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Fatalf("mpirun not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev), as .ci/run does")
	}
}

// Run runs test (a test of the calling binary) in np processes under
// mpirun and returns their combined output; a process's failure, or fewer
// than np processes reporting the test passed (one skipped it), fails t
// with that output.
func Run(t *testing.T, np int, test string, env ...string) string {
	t.Helper()
	Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := Command(ctx, np, append(env, EnvChild+"=1"), os.Args[0], "-test.run", "^"+test+"$", "-test.v", "-test.count=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun -np %d %s: %v\n%s", np, test, err, out)
	}
	if n := strings.Count(string(out), "--- PASS: "+test+" "); n != np {
		t.Fatalf("mpirun -np %d %s: %d processes passed:\n%s", np, test, n, out)
	}
	return string(out)
}
