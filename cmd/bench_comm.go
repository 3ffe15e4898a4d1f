package cmd

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/dist"
	"github.com/strata-ai/strata/internal/units"
)

// benchCommCommand is `strata bench comm`: the cpu backend's all-reduce
// across the processes of an mpirun job against MPI_Allreduce.
func benchCommCommand() *cli.Command {
	return &cli.Command{
		Name:  "comm",
		Usage: "all-reduce across processes (run under mpirun): the cpu backend's, in rank order, against MPI_Allreduce of the same bytes",
		Description: "Run it as a job: mpirun -np 2 strata bench comm --size 64MiB. Each process drives one cpu device;\n" +
			"the device's AllReduce (fp32 sum in global rank order, exchanged through Open MPI) alternates with the\n" +
			"same library's MPI_Allreduce of the same buffer, one of each per round; medians and bus bandwidth\n" +
			"(2(N-1)/N × bytes / time, as NCCL's tests count an all-reduce). Process 0 prints.\n" +
			"bench/comm.sh also runs a C program's MPI_Allreduce (built with mpicc) beside it.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "size", Value: "64MiB", Usage: "bytes of the fp32 buffer"},
			&cli.IntFlag{Name: "rounds", Value: 10, Usage: "alternating rounds"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
		},
		Action: func(c *cli.Context) error {
			size, err := units.ParseBytes(c.String("size"))
			if err != nil {
				return usagef("bench comm: --size: %v", err)
			}
			place, err := dist.FromEnv(dist.Flags{}, os.Getenv)
			if err != nil {
				return usagef("bench comm: %v", err)
			}
			if place.Launcher != dist.LaunchMPI && place.Launcher != dist.LaunchSlurm || place.Single() {
				return usagef("bench comm: run it as a job of 2 or more processes: mpirun -np 2 strata bench comm")
			}
			m, err := dist.OpenMPI()
			if err != nil {
				return err
			}
			defer m.Close()
			o := bench.CommOptions{Bytes: size, Rounds: c.Int("rounds"), Net: m}
			if err := o.WithDefaults().Validate(); err != nil {
				return usagef("%v", err)
			}
			res, err := bench.RunComm(o)
			if err != nil || m.Proc() != 0 {
				return err
			}
			return printResult(c.App.Writer, c.Bool("json"), res)
		},
	}
}
