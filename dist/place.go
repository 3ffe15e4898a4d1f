package dist

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Launcher names where a process learned its place.
const (
	LaunchNone     = ""         // one process: no launcher variables, no flags
	LaunchTorchrun = "torchrun" // RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
	LaunchSlurm    = "slurm"    // SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST
	LaunchMPI      = "mpirun"   // OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
	LaunchFlags    = "flags"    // --nnodes, --node-rank, --master
)

// DefaultPort is the rendezvous port when a launcher names a host but no
// port (Slurm without MASTER_PORT): torchrun's default.
const DefaultPort = 29500

// Place is where one process of a job stands: its rank among the job's
// processes, its rank among the processes of its node, and where the
// processes meet (for a launcher that does not connect them itself).
type Place struct {
	Launcher  string
	Rank      int    // this process, 0 ≤ Rank < Size
	Size      int    // processes in the job
	LocalRank int    // this process among those of its node
	LocalSize int    // processes on this node (0: unknown)
	Master    string // host:port of the rendezvous ("" under mpirun: MPI connects the processes)
}

// Single reports whether the job is this process alone.
func (p Place) Single() bool { return p.Size <= 1 }

func (p Place) String() string {
	if p.Single() {
		return "one process"
	}
	s := fmt.Sprintf("process %d of %d (%s", p.Rank, p.Size, p.Launcher)
	if p.LocalSize > 0 {
		s += fmt.Sprintf(", %d of %d on this node", p.LocalRank, p.LocalSize)
	}
	if p.Master != "" {
		s += ", rendezvous " + p.Master
	}
	return s + ")"
}

// Flags are the command line's say in a process's place: --nnodes,
// --node-rank and --master (one process per node). Zero values: not given.
type Flags struct {
	Nodes    int
	NodeRank int
	Master   string
}

// ErrPlace is wrapped by every error of FromEnv.
var ErrPlace = errors.New("dist: where this process stands")

// FromEnv reads the process's place from the flags, when given, else from
// the variables a launcher sets, in this order: torchrun's (RANK and
// WORLD_SIZE: torchrun, and DeepSpeed's launcher, which sets the same), Open
// MPI's (mpirun), Slurm's (srun). A launcher inside another (srun starting
// torchrun) is the inner one, whose variables are the more specific. With
// none, the process is alone. A variable that is set but not a number, a
// rank outside the job, or flags that contradict the environment are
// errors naming the variable.
func FromEnv(f Flags, getenv func(string) string) (Place, error) {
	if f.Nodes > 0 || f.Master != "" {
		return fromFlags(f, getenv)
	}
	switch {
	case getenv("RANK") != "" || getenv("WORLD_SIZE") != "":
		return fromTorchrun(getenv)
	case getenv("OMPI_COMM_WORLD_SIZE") != "":
		return fromMPI(getenv)
	case getenv("SLURM_NTASKS") != "" && getenv("SLURM_PROCID") != "":
		return fromSlurm(getenv)
	}
	return Place{Size: 1, LocalSize: 1}, nil
}

func fromFlags(f Flags, getenv func(string) string) (Place, error) {
	switch {
	case f.Nodes < 1:
		return Place{}, fmt.Errorf("%w: --master %s without --nnodes: give the node count", ErrPlace, f.Master)
	case f.NodeRank < 0 || f.NodeRank >= f.Nodes:
		return Place{}, fmt.Errorf("%w: --node-rank %d is outside 0..%d (--nnodes %d)", ErrPlace, f.NodeRank, f.Nodes-1, f.Nodes)
	case f.Nodes > 1 && f.Master == "":
		return Place{}, fmt.Errorf("%w: --nnodes %d needs --master HOST:PORT, where node 0 listens", ErrPlace, f.Nodes)
	}
	p := Place{Launcher: LaunchFlags, Rank: f.NodeRank, Size: f.Nodes, LocalSize: 1}
	if f.Nodes > 1 {
		m, err := hostPort(f.Master, "--master")
		if err != nil {
			return Place{}, err
		}
		p.Master = m
	}
	return p, nil
}

func fromTorchrun(getenv func(string) string) (Place, error) {
	var p Place
	var err error
	p.Launcher = LaunchTorchrun
	if p.Size, err = need(getenv, "WORLD_SIZE", 1); err != nil {
		return Place{}, err
	}
	if p.Rank, err = need(getenv, "RANK", 0); err != nil {
		return Place{}, err
	}
	if p.LocalRank, err = optional(getenv, "LOCAL_RANK", 0); err != nil {
		return Place{}, err
	}
	if p.LocalSize, err = optional(getenv, "LOCAL_WORLD_SIZE", 0); err != nil {
		return Place{}, err
	}
	if err := p.check("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"); err != nil {
		return Place{}, err
	}
	if p.Size > 1 {
		addr := getenv("MASTER_ADDR")
		if addr == "" {
			return Place{}, fmt.Errorf("%w: WORLD_SIZE=%d but MASTER_ADDR is not set (torchrun sets it; set it to node 0's address)", ErrPlace, p.Size)
		}
		port, err := optional(getenv, "MASTER_PORT", DefaultPort)
		if err != nil {
			return Place{}, err
		}
		p.Master = net.JoinHostPort(addr, strconv.Itoa(port))
	}
	return p, nil
}

func fromMPI(getenv func(string) string) (Place, error) {
	var p Place
	var err error
	p.Launcher = LaunchMPI
	if p.Size, err = need(getenv, "OMPI_COMM_WORLD_SIZE", 1); err != nil {
		return Place{}, err
	}
	if p.Rank, err = need(getenv, "OMPI_COMM_WORLD_RANK", 0); err != nil {
		return Place{}, err
	}
	if p.LocalRank, err = optional(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", 0); err != nil {
		return Place{}, err
	}
	if p.LocalSize, err = optional(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", 0); err != nil {
		return Place{}, err
	}
	return p, p.check("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
}

func fromSlurm(getenv func(string) string) (Place, error) {
	var p Place
	var err error
	p.Launcher = LaunchSlurm
	if p.Size, err = need(getenv, "SLURM_NTASKS", 1); err != nil {
		return Place{}, err
	}
	if p.Rank, err = need(getenv, "SLURM_PROCID", 0); err != nil {
		return Place{}, err
	}
	if p.LocalRank, err = optional(getenv, "SLURM_LOCALID", 0); err != nil {
		return Place{}, err
	}
	if err := p.check("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""); err != nil {
		return Place{}, err
	}
	if p.Size > 1 {
		addr := getenv("MASTER_ADDR")
		if addr == "" {
			list := getenv("SLURM_JOB_NODELIST")
			if list == "" {
				list = getenv("SLURM_NODELIST")
			}
			if addr, err = FirstHost(list); err != nil {
				return Place{}, fmt.Errorf("%w: SLURM_JOB_NODELIST %q: %v", ErrPlace, list, err)
			}
		}
		port, err := optional(getenv, "MASTER_PORT", DefaultPort)
		if err != nil {
			return Place{}, err
		}
		p.Master = net.JoinHostPort(addr, strconv.Itoa(port))
	}
	return p, nil
}

// check says which variable is out of range.
func (p Place) check(rank, size, localRank, localSize string) error {
	switch {
	case p.Rank >= p.Size:
		return fmt.Errorf("%w: %s=%d is outside the job (%s=%d)", ErrPlace, rank, p.Rank, size, p.Size)
	case p.LocalSize > 0 && p.LocalRank >= p.LocalSize:
		return fmt.Errorf("%w: %s=%d is outside the node (%s=%d)", ErrPlace, localRank, p.LocalRank, localSize, p.LocalSize)
	case p.LocalSize > p.Size:
		return fmt.Errorf("%w: %s=%d is more than the job's %s=%d", ErrPlace, localSize, p.LocalSize, size, p.Size)
	}
	return nil
}

// need reads a non-negative integer variable that must be set, at least min.
func need(getenv func(string) string, name string, min int) (int, error) {
	s := getenv(name)
	if s == "" {
		return 0, fmt.Errorf("%w: %s is not set", ErrPlace, name)
	}
	return parse(name, s, min)
}

// optional reads a non-negative integer variable, def when unset.
func optional(getenv func(string) string, name string, def int) (int, error) {
	s := getenv(name)
	if s == "" {
		return def, nil
	}
	return parse(name, s, 0)
}

func parse(name, s string, min int) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < min {
		return 0, fmt.Errorf("%w: %s=%q is not an integer ≥ %d", ErrPlace, name, s, min)
	}
	return v, nil
}

// hostPort checks an address of the form HOST:PORT.
func hostPort(s, what string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return "", fmt.Errorf("%w: %s %q: want HOST:PORT, e.g. node0:%d", ErrPlace, what, s, DefaultPort)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%w: %s %q: port %q is not 1..65535", ErrPlace, what, s, port)
	}
	return net.JoinHostPort(host, port), nil
}

// FirstHost is the first host of a Slurm hostlist: "node[03-05,9],gpu1"
// is node03; "a1,b2" is a1; "rack[1-2]-n[4-5]" is rack1-n4 (a range's
// first value keeps its zero padding, as scontrol show hostnames prints).
func FirstHost(list string) (string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return "", errors.New("empty")
	}
	var b strings.Builder
	for i := 0; i < len(list); i++ {
		switch c := list[i]; c {
		case ',':
			return finish(&b)
		case '[':
			j := strings.IndexByte(list[i:], ']')
			if j < 0 {
				return "", fmt.Errorf("unclosed [ at %d", i)
			}
			first := list[i+1 : i+j]
			if k := strings.IndexAny(first, ",-"); k >= 0 {
				first = first[:k]
			}
			if first == "" || strings.Trim(first, "0123456789") != "" {
				return "", fmt.Errorf("range %q is not numbers", list[i:i+j+1])
			}
			b.WriteString(first)
			i += j
		case ']':
			return "", fmt.Errorf("] without [ at %d", i)
		default:
			b.WriteByte(c)
		}
	}
	return finish(&b)
}

func finish(b *strings.Builder) (string, error) {
	if b.Len() == 0 {
		return "", errors.New("no host before the first comma")
	}
	return b.String(), nil
}
