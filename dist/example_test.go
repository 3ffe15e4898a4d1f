package dist_test

import (
	"fmt"

	"github.com/strata-ai/strata/dist"
)

// ExampleFromEnv reads a process's place in a job from the variables
// torchrun sets (a map stands in for os.Getenv), and finds the rendezvous
// host of a Slurm job from its node list. Nothing here starts MPI.
func ExampleFromEnv() {
	env := map[string]string{
		"RANK": "3", "WORLD_SIZE": "4",
		"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "node01", "MASTER_PORT": "29500",
	}
	getenv := func(k string) string { return env[k] }

	p, err := dist.FromEnv(dist.Flags{}, getenv)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.Launcher, p.Rank, p.Size, p.LocalRank, p.LocalSize, p.Master, p.Single())

	// With no launcher's variables, the process is alone.
	alone, _ := dist.FromEnv(dist.Flags{}, func(string) string { return "" })
	fmt.Println(alone.Size, alone.Single())

	host, _ := dist.FirstHost("node[03-05,9],gpu1")
	fmt.Println(host)
	// Output:
	// torchrun 3 4 1 2 node01:29500 false
	// 1 true
	// node03
}
