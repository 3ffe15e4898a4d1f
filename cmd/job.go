package cmd

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/dist"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/gpu/backend"
)

// A job of several processes (`mpirun -np P strata train --devices L …`):
// each process drives its L devices as the global ranks p·L .. p·L+L−1 of
// N = P·L, the collectives cross processes on Open MPI (gpu/cpu's Net),
// and the engine exchanges the host values and gathers checkpoints and
// weights to process 0 (engine.Options.Procs). Process 0 is the run as the
// user sees it: it prints, takes --out (its lock, config.json, steps.jsonl,
// summary.json, checkpoints, model.safetensors); the others print nothing
// but their errors, and send what process 0 writes.

// jobFlags are train's flags of the process's place.
func jobFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "nnodes", Usage: "processes (nodes) of the job, one per node, when no launcher sets them (torchrun, mpirun or Slurm do)"},
		&cli.IntFlag{Name: "node-rank", Usage: "with --nnodes: this node's rank, 0 .. nnodes-1"},
		&cli.StringFlag{Name: "master", Usage: "with --nnodes: HOST:PORT where node 0 listens"},
	}
}

// job is this process's place in a job of several; nil for a job of one.
type job struct {
	place dist.Place
	mpi   *dist.MPI // the host's exchanges: the engine's (engine.Options.Procs), the loop's
	devs  *dist.MPI // the devices' collectives, on a communicator of their own (MPI.Dup)
	// agreed is set once the processes exchanged their runs (agree.go).
	agreed bool
}

// openJob reads the process's place (flags, else a launcher's variables)
// and, for a job of several, joins it: Open MPI, which must have started
// the processes (mpirun, or srun with PMIx). Nil for a process alone.
func openJob(c *cli.Context) (*job, error) {
	place, err := dist.FromEnv(dist.Flags{Nodes: c.Int("nnodes"), NodeRank: c.Int("node-rank"), Master: c.String("master")}, os.Getenv)
	if err != nil {
		return nil, usagef("train: %v", err)
	}
	if place.Single() {
		return nil, nil
	}
	if !c.IsSet("devices") {
		return nil, usagef("train: %s: a job of several processes needs --devices, each process's devices (the job has processes × devices ranks)", place)
	}
	if place.Launcher != dist.LaunchMPI && place.Launcher != dist.LaunchSlurm {
		return nil, fmt.Errorf("train: %s: %w: a job that %s started: the processes exchange through Open MPI (the cpu backend's collectives, the cuda backend's NCCL id, the host's values), which joins only processes it started (its singletons cannot connect without its own server): launch with mpirun -np %d (or srun --mpi=pmix)",
			place, engine.ErrNotBuilt, place.Launcher, place.Size)
	}
	m, err := dist.OpenMPI()
	if err != nil {
		return nil, fmt.Errorf("train: %s: %w", place, err)
	}
	if m.Procs() != place.Size || m.Proc() != place.Rank {
		return nil, fmt.Errorf("train: %s, but MPI says process %d of %d: launch every process with the same launcher (mpirun -np %d, or srun --mpi=pmix)", place, m.Proc(), m.Procs(), place.Size)
	}
	d, err := m.Dup()
	if err != nil {
		return nil, fmt.Errorf("train: %s: %w", place, err)
	}
	return &job{place: place, mpi: m, devs: d}, nil
}

// leader reports whether this process writes the run: alone, or process 0.
func (j *job) leader() bool { return j == nil || j.place.Rank == 0 }

// procs is the job's count of processes (1 alone).
func (j *job) procs() int {
	if j == nil {
		return 1
	}
	return j.place.Size
}

// quiet is w for process 0, and a writer that drops it for the others.
func (j *job) quiet(w io.Writer) io.Writer {
	if j.leader() {
		return w
	}
	return io.Discard
}

// nodeProcs is the job's processes on this node, which share its
// strata.host_budget (the launcher's local size; 0 when it gives none).
func (j *job) nodeProcs() int {
	if j == nil {
		return 0
	}
	return j.place.LocalSize
}

// engineProcs is the engine's handle on the other processes.
func (j *job) engineProcs() engine.Procs {
	if j == nil {
		return nil
	}
	return j.mpi
}

// openDevices opens this process's devices: joined with the other
// processes' in a job of several.
func (j *job) openDevices(name string, n int, hbmBytes int64, deterministic bool) (*backend.Devices, error) {
	if j == nil {
		return backend.Open(name, n, hbmBytes, deterministic)
	}
	return backend.OpenNet(name, n, hbmBytes, deterministic, j.devs)
}

// anySignal is, in every process, the signal of the lowest process that
// saw one (sig, this process's; nil when none did): a collective, so the
// processes stop after the same step whichever of them saw the signal, and
// end with the same status.
func (j *job) anySignal(sig os.Signal) (os.Signal, error) {
	if j == nil {
		return sig, nil
	}
	mine := []byte{0}
	if s, ok := sig.(syscall.Signal); ok {
		mine[0] = byte(s)
	} else if sig != nil {
		mine[0] = byte(syscall.SIGINT)
	}
	all := make([]byte, j.place.Size)
	if err := j.mpi.Allgather(mine, all); err != nil {
		return nil, fmt.Errorf("train: %s: %w", j.place, err)
	}
	for _, b := range all {
		if b != 0 {
			return syscall.Signal(b), nil
		}
	}
	return nil, nil
}

// close leaves MPI (every process calls it: MPI_Finalize is collective;
// a process that failed alone has ended the job before, job.ended).
func (j *job) close() {
	if j == nil {
		return
	}
	j.devs.Close()
	j.mpi.Close()
}

// follow is process 0's verdict on a save, in every process: process 0
// sends whether its run goes on (path: the checkpoint, maybe "") or ends
// (err), and the others take it for theirs.
func (j *job) follow(path string, err error) (string, error) {
	msg, end := path, byte(0)
	if err != nil {
		msg, end = err.Error(), 1
	}
	hdr := make([]byte, 9)
	if j.leader() {
		hdr[0] = end
		binary.LittleEndian.PutUint64(hdr[1:], uint64(len(msg)))
	}
	if berr := j.mpi.Bcast(hdr, 0); berr != nil {
		return "", fmt.Errorf("train: %s: %w", j.place, berr)
	}
	b := make([]byte, binary.LittleEndian.Uint64(hdr[1:]))
	copy(b, msg)
	if berr := j.mpi.Bcast(b, 0); berr != nil {
		return "", fmt.Errorf("train: %s: %w", j.place, berr)
	}
	if j.leader() {
		return path, err
	}
	if hdr[0] != 0 {
		return "", jobError{msg: fmt.Sprintf("train: process 0 ended the run: %s", b), quiet: true}
	}
	return string(b), nil
}

// launcher is what starts the job again, before "strata train …" in the
// command that goes on with a run: mpirun with the options this job was
// started with (read from the parent process, mpirun, when it is one: its
// arguments before the program), else "mpirun -np P "; "" alone.
func (j *job) launcher() string {
	switch {
	case j == nil:
		return ""
	case j.place.Launcher == dist.LaunchSlurm:
		return fmt.Sprintf("srun --mpi=pmix -n %d ", j.place.Size)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", os.Getppid())); err == nil {
		if opts := mpirunOptions(strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), os.Args[0]); opts != "" {
			return opts + " "
		}
	}
	return fmt.Sprintf("mpirun -np %d ", j.place.Size)
}

// mpirunOptions is argv of mpirun (mpiexec, orterun, prterun) up to the
// program prog (quoted for a shell), or "" when argv is not mpirun's or
// does not start prog (or starts several programs: MPMD's ":").
func mpirunOptions(argv []string, prog string) string {
	if len(argv) < 2 || !slices.Contains([]string{"mpirun", "mpiexec", "orterun", "prterun"}, filepath.Base(argv[0])) || slices.Contains(argv, ":") {
		return ""
	}
	for i := 1; i < len(argv); i++ {
		if argv[i] == prog || (filepath.Base(argv[i]) == filepath.Base(prog) && !strings.HasPrefix(argv[i], "-")) {
			q := make([]string, i)
			for k, a := range argv[:i] {
				q[k] = shellQuote(a)
			}
			return strings.Join(q, " ")
		}
	}
	return ""
}
