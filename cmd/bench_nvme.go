package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/internal/units"
	"github.com/urfave/cli/v2"
)

// benchNVMeCommand measures what the drives deliver through Strata's NVMe
// engine, in the shape of fio --ioengine=io_uring --direct=1.
func benchNVMeCommand() *cli.Command {
	return &cli.Command{
		Name:  "nvme",
		Usage: "measure NVMe throughput and latency through Strata's engine (io_uring or pread, O_DIRECT)",
		Description: "Reads or writes --size bytes per --path in --bs blocks with --qd requests in flight and prints\n" +
			"MB/s (1 MB = 10^6 B), IOPS, completion latency p50/p99/p99.9 and CPU seconds per GB.\n" +
			"A directory --path gets a temporary file, removed at the end, on errors and on Ctrl-C or SIGTERM.\n" +
			"An existing file --path is only read, never changed: a write run on it, or a read run with --size above its size,\n" +
			"is refused unless --force (then it is overwritten or extended). A path that does not exist is refused.\n" +
			"The I/O buffers are in huge pages (the \"buffers:\" line says when they cannot be), and the \"block:\" line gives the\n" +
			"block layer's request count and average size for the run, with a warning when requests were split below --bs.\n" +
			"--sweep runs block sizes x queue depths and prints the best setting as the \"aio\" block of the config.\n" +
			"Compare with fio side by side: bench/nvme-vs-fio.sh.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "path", Usage: "file or directory on the drive to test (repeatable: several drives, each once)", Required: true},
			&cli.StringFlag{Name: "rw", Value: nvmeDefaults.RW, Usage: "read, write, randread, randwrite or mixed (concurrent reads and writes)", DefaultText: nvmeDefaults.RW},
			&cli.StringFlag{Name: "bs", Value: units.FormatSize(nvmeDefaults.BlockBytes), Usage: "block size (binary suffixes: 128K, 1M)", DefaultText: units.FormatSize(nvmeDefaults.BlockBytes)},
			&cli.IntFlag{Name: "qd", Value: nvmeDefaults.QueueDepth, Usage: "requests in flight", DefaultText: strconv.Itoa(nvmeDefaults.QueueDepth)},
			&cli.StringFlag{Name: "size", Value: units.FormatSize(nvmeDefaults.SizeBytes), Usage: "bytes per path", DefaultText: units.FormatSize(nvmeDefaults.SizeBytes)},
			&cli.StringFlag{Name: "engine", Value: nvmeDefaults.Engine, Usage: "auto (io_uring, else pread workers, and says why), uring or pread", DefaultText: nvmeDefaults.Engine},
			&cli.IntFlag{Name: "loops", Usage: "passes over the file (not with --duration)", DefaultText: strconv.Itoa(nvmeDefaults.Loops)},
			&cli.DurationFlag{Name: "duration", Usage: "run passes until this much time has elapsed (instead of --loops)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per run"},
			&cli.BoolFlag{Name: "sweep", Usage: "run every --sweep-bs x --sweep-qd and print the best as the aio config block"},
			&cli.StringFlag{Name: "sweep-bs", Value: "128K,256K,512K,1M,4M", Usage: "block sizes for --sweep"},
			&cli.StringFlag{Name: "sweep-qd", Value: "4,8,16,32,64", Usage: "queue depths for --sweep"},
			&cli.BoolFlag{Name: "trace-block", Usage: "add device latency from the block:block_rq_issue/complete tracepoints (needs BPF)"},
			&cli.IntFlag{Name: "submit-batch", Value: nvmeDefaults.SubmitBatch, Usage: "requests per io_uring_enter at most (above 1 the block layer may merge adjacent ones)", DefaultText: strconv.Itoa(nvmeDefaults.SubmitBatch)},
			&cli.BoolFlag{Name: "no-fixed", Usage: "do not register buffers and files with io_uring"},
			&cli.BoolFlag{Name: "force", Usage: "allow a write run to overwrite an existing --path file, and a read run to extend it"},
			&cli.BoolFlag{Name: "quiet", Usage: "no progress on stderr"},
		},
		Action: runBenchNVMe,
	}
}

// nvmeDefaults are the library's defaults, shown in --help and applied to
// the flags that were not given.
var nvmeDefaults = bench.NVMeOptions{}.WithDefaults()

// nvmeOptions turns the flags into options: the defaults for the flags that
// were not given, the values of those that were (an explicit 0 stays 0, and
// Validate refuses it).
func nvmeOptions(c *cli.Context) (bench.NVMeOptions, error) {
	o := bench.NVMeOptions{Paths: c.StringSlice("path"), Duration: c.Duration("duration"),
		NoFixed: c.Bool("no-fixed"), TraceBlock: c.Bool("trace-block"), Force: c.Bool("force")}
	if c.IsSet("duration") && o.Duration <= 0 {
		return o, usagef("--duration %v: want > 0", o.Duration)
	}
	o = o.WithDefaults()
	// Every flag but loops (its default depends on --duration) has its default as its value.
	o.RW, o.Engine, o.QueueDepth, o.SubmitBatch = c.String("rw"), c.String("engine"), c.Int("qd"), c.Int("submit-batch")
	if c.IsSet("loops") {
		o.Loops = c.Int("loops")
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"bs", &o.BlockBytes}, {"size", &o.SizeBytes}} {
		v, err := units.ParseBytes(c.String(f.name))
		if err != nil {
			return o, usagef("--%s: %v", f.name, err)
		}
		*f.dst = v
	}
	if err := o.Validate(); err != nil {
		return o, usagef("%v", err)
	}
	return o, nil
}

func runBenchNVMe(c *cli.Context) error {
	opts, err := nvmeOptions(c)
	if err != nil {
		return err
	}
	out := c.App.Writer
	ctx, errOut, stop := stopOnSignal(c.App.ErrWriter) // errOut: shared with the signal's messages
	defer stop()
	if !c.Bool("quiet") {
		opts.Progress = bench.ProgressLine(errOut)
	}
	asJSON := c.Bool("json")
	afterRun := func(r bench.NVMeResult, err error) {
		if opts.Progress != nil && r.Seconds >= 1 {
			fmt.Fprint(errOut, "\r\033[K")
		}
		if err == nil && asJSON {
			b, _ := json.Marshal(r)
			fmt.Fprintln(out, string(b))
		}
	}
	if !c.Bool("sweep") {
		r, err := bench.RunNVMe(ctx, opts)
		afterRun(r, err)
		if err != nil {
			return signalExit(ctx, err)
		}
		if asJSON {
			return nil
		}
		return r.WriteText(out, opts)
	}
	sw := bench.NVMeSweepOptions{Runs: sweepRuns, AfterRun: afterRun}
	if sw.BlockBytes, err = parseList(c.String("sweep-bs"), units.ParseBytes); err != nil {
		return usagef("--sweep-bs: %v", err)
	}
	if sw.QueueDepths, err = parseList(c.String("sweep-qd"), func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }); err != nil {
		return usagef("--sweep-qd: %v", err)
	}
	// Refuse a bad setting before the first run, not after an hour.
	if err := sw.Validate(opts); err != nil {
		return usagef("--sweep: %v", err)
	}
	res, err := bench.SweepNVMe(ctx, opts, sw)
	if err != nil {
		return signalExit(ctx, err)
	}
	return res.WriteText(out)
}

func parseList(s string, parse func(string) (int64, error)) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

var latency = bench.FormatLatency // µs below 1 ms, else ms, as the report prints latencies

// sweepRuns is how many times --sweep measures each setting.
const sweepRuns = bench.NVMeSweepRuns

// signalStop is the cause of a run stopped by SIGINT or SIGTERM.
type signalStop struct{ sig syscall.Signal }

func (e signalStop) Error() string { return "stopped by " + e.sig.String() }

// stopOnSignal returns a context that the first SIGINT or SIGTERM cancels
// (the run stops issuing requests, lets those in flight complete and
// removes its temporary files), on the commands' one signal watcher
// (interrupts): a second signal exits at once. errOut is stderr shared
// with the watcher's messages.
func stopOnSignal(stderr io.Writer) (ctx context.Context, errOut io.Writer, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	in := watchInterrupts(stderr,
		func(s os.Signal) string {
			cancel(signalStop{s.(syscall.Signal)})
			return "stopping; the requests in flight complete and temporary files are removed"
		},
		func(os.Signal) string { return "exiting now; a temporary strata-bench-nvme-*.dat may remain" }, nil)
	return ctx, in.stderr, func() {
		in.stop()
		cancel(nil)
	}
}

// signalExit turns an error of a run stopped by a signal into exit status
// 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).
func signalExit(ctx context.Context, err error) error {
	var s signalStop
	if !errors.As(context.Cause(ctx), &s) {
		return err
	}
	return interruptedError{msg: fmt.Sprintf("%v; temporary files removed", err), status: exitStatus(s.sig)}
}
