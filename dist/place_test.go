package dist

import (
	"errors"
	"strings"
	"testing"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	cases := []struct {
		name  string
		flags Flags
		env   func(string) string
		want  Place
		err   string // substring of the error; "" none
	}{
		{name: "alone", env: env(), want: Place{Size: 1, LocalSize: 1}},
		{name: "torchrun", env: env("RANK", "3", "WORLD_SIZE", "4", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "2", "MASTER_ADDR", "10.0.0.1", "MASTER_PORT", "29400"),
			want: Place{Launcher: LaunchTorchrun, Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, Master: "10.0.0.1:29400"}},
		{name: "torchrun default port, IPv6", env: env("RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "fd00::2"),
			want: Place{Launcher: LaunchTorchrun, Size: 2, Master: "[fd00::2]:29500"}},
		{name: "torchrun one process", env: env("RANK", "0", "WORLD_SIZE", "1"), want: Place{Launcher: LaunchTorchrun, Size: 1}},
		{name: "mpirun", env: env("OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
			want: Place{Launcher: LaunchMPI, Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2}},
		{name: "slurm", env: env("SLURM_PROCID", "5", "SLURM_NTASKS", "8", "SLURM_LOCALID", "1", "SLURM_JOB_NODELIST", "gpu[07-10,12],cpu1"),
			want: Place{Launcher: LaunchSlurm, Rank: 5, Size: 8, LocalRank: 1, Master: "gpu07:29500"}},
		{name: "torchrun inside srun", env: env("SLURM_PROCID", "5", "SLURM_NTASKS", "8", "RANK", "2", "WORLD_SIZE", "16", "MASTER_ADDR", "h", "MASTER_PORT", "1"),
			want: Place{Launcher: LaunchTorchrun, Rank: 2, Size: 16, Master: "h:1"}},
		{name: "flags", flags: Flags{Nodes: 2, NodeRank: 1, Master: "node0:29600"}, env: env("RANK", "7"),
			want: Place{Launcher: LaunchFlags, Rank: 1, Size: 2, LocalSize: 1, Master: "node0:29600"}},
		{name: "flags one node", flags: Flags{Nodes: 1}, env: env(), want: Place{Launcher: LaunchFlags, Size: 1, LocalSize: 1}},
		{name: "rank past size", env: env("RANK", "4", "WORLD_SIZE", "4", "MASTER_ADDR", "h"), err: "RANK=4 is outside the job (WORLD_SIZE=4)"},
		{name: "not a number", env: env("OMPI_COMM_WORLD_SIZE", "two", "OMPI_COMM_WORLD_RANK", "0"), err: `OMPI_COMM_WORLD_SIZE="two" is not an integer`},
		{name: "no master", env: env("RANK", "0", "WORLD_SIZE", "2"), err: "MASTER_ADDR is not set"},
		{name: "missing rank", env: env("WORLD_SIZE", "2", "MASTER_ADDR", "h"), err: "RANK is not set"},
		{name: "local rank", env: env("RANK", "0", "WORLD_SIZE", "4", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2", "MASTER_ADDR", "h"), err: "LOCAL_RANK=2 is outside the node"},
		{name: "bad port", env: env("RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "x"), err: `MASTER_PORT="x"`},
		{name: "flags without master", flags: Flags{Nodes: 2}, env: env(), err: "--nnodes 2 needs --master HOST:PORT"},
		{name: "flags node rank", flags: Flags{Nodes: 2, NodeRank: 2, Master: "h:1"}, env: env(), err: "--node-rank 2 is outside 0..1"},
		{name: "flags master without nodes", flags: Flags{Master: "h:1"}, env: env(), err: "without --nnodes"},
		{name: "flags master no port", flags: Flags{Nodes: 2, Master: "h"}, env: env(), err: "want HOST:PORT"},
		{name: "flags master port range", flags: Flags{Nodes: 2, Master: "h:70000"}, env: env(), err: "is not 1..65535"},
		{name: "slurm bad list", env: env("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_JOB_NODELIST", "n[1-"), err: "unclosed ["},
	}
	for _, c := range cases {
		got, err := FromEnv(c.flags, c.env)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, ErrPlace)):
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
		case c.err == "" && got != c.want:
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestFirstHost(t *testing.T) {
	for in, want := range map[string]string{
		"node1":              "node1",
		"a1,b2":              "a1",
		"node[03-05,9],gpu1": "node03",
		"rack[1-2]-n[4-5]":   "rack1-n4",
		"n[7]":               "n7",
		" x[010-012] ":       "x010",
	} {
		if got, err := FirstHost(in); err != nil || got != want {
			t.Errorf("FirstHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", ",a", "n[a-b]", "n]", "n[1-"} {
		if got, err := FirstHost(in); err == nil {
			t.Errorf("FirstHost(%q) = %q, want an error", in, got)
		}
	}
}
