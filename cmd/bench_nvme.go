package cmd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

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
			&cli.StringFlag{Name: "rw", Usage: "read, write, randread, randwrite or mixed (concurrent reads and writes)", DefaultText: nvmeDefaults.RW},
			&cli.StringFlag{Name: "bs", Usage: "block size (binary suffixes: 128K, 1M)", DefaultText: units.FormatSize(nvmeDefaults.BlockBytes)},
			&cli.IntFlag{Name: "qd", Usage: "requests in flight", DefaultText: strconv.Itoa(nvmeDefaults.QueueDepth)},
			&cli.StringFlag{Name: "size", Usage: "bytes per path", DefaultText: units.FormatSize(nvmeDefaults.SizeBytes)},
			&cli.StringFlag{Name: "engine", Usage: "auto (io_uring, else pread workers, and says why), uring or pread", DefaultText: nvmeDefaults.Engine},
			&cli.IntFlag{Name: "loops", Usage: "passes over the file (not with --duration)", DefaultText: strconv.Itoa(nvmeDefaults.Loops)},
			&cli.DurationFlag{Name: "duration", Usage: "run passes until this much time has elapsed (instead of --loops)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per run"},
			&cli.BoolFlag{Name: "sweep", Usage: "run every --sweep-bs x --sweep-qd and print the best as the aio config block"},
			&cli.StringFlag{Name: "sweep-bs", Value: "128K,256K,512K,1M,4M", Usage: "block sizes for --sweep"},
			&cli.StringFlag{Name: "sweep-qd", Value: "4,8,16,32,64", Usage: "queue depths for --sweep"},
			&cli.BoolFlag{Name: "trace-block", Usage: "add device latency from the block:block_rq_issue/complete tracepoints (needs BPF)"},
			&cli.IntFlag{Name: "submit-batch", Usage: "requests per io_uring_enter at most (above 1 the block layer may merge adjacent ones)", DefaultText: strconv.Itoa(nvmeDefaults.SubmitBatch)},
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
	if c.IsSet("rw") {
		o.RW = c.String("rw")
	}
	if c.IsSet("engine") {
		o.Engine = c.String("engine")
	}
	if c.IsSet("qd") {
		o.QueueDepth = c.Int("qd")
	}
	if c.IsSet("loops") {
		o.Loops = c.Int("loops")
	}
	if c.IsSet("submit-batch") {
		o.SubmitBatch = c.Int("submit-batch")
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"bs", &o.BlockBytes}, {"size", &o.SizeBytes}} {
		if !c.IsSet(f.name) {
			continue
		}
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
		opts.Progress = func(done, total int64, elapsed time.Duration) {
			rate := float64(done) / 1e6 / elapsed.Seconds()
			if total > 0 {
				fmt.Fprintf(errOut, "\r  %s / %s  %.0f MB/s   ", units.FormatBytes(done), units.FormatBytes(total), rate)
			} else {
				fmt.Fprintf(errOut, "\r  %s  %v  %.0f MB/s   ", units.FormatBytes(done), elapsed.Round(time.Second), rate)
			}
		}
	}
	asJSON := c.Bool("json")
	run := func(o bench.NVMeOptions) (bench.NVMeResult, error) {
		if err := o.Validate(); err != nil {
			return bench.NVMeResult{}, usagef("%v", err)
		}
		r, err := bench.RunNVMe(ctx, o)
		if o.Progress != nil && r.Seconds >= 1 {
			fmt.Fprint(errOut, "\r\033[K")
		}
		if err != nil {
			return r, signalExit(ctx, err)
		}
		if asJSON {
			b, _ := json.Marshal(r)
			fmt.Fprintln(out, string(b))
		}
		return r, nil
	}
	if !c.Bool("sweep") {
		r, err := run(opts)
		if err != nil {
			return err
		}
		if !asJSON {
			printNVMe(out, opts, r)
		}
		return nil
	}
	return sweepNVMe(c, opts, run, out)
}

// latency prints a latency given in microseconds: µs below 1 ms, else ms.
func latency(us float64) string {
	if us < 1000 {
		return fmt.Sprintf("%.0f µs", us)
	}
	return fmt.Sprintf("%.2f ms", us/1000)
}

func printNVMe(w io.Writer, o bench.NVMeOptions, r bench.NVMeResult) {
	fmt.Fprintf(w, "strata bench nvme %s\n", o)
	for _, n := range r.Reclaimed {
		fmt.Fprintf(w, "note:       %s\n", n)
	}
	fmt.Fprintf(w, "engine:     %s\n", r.EngineInfo)
	fmt.Fprintf(w, "throughput: %.1f MB/s (1 MB = 10^6 B)", r.MBps)
	if r.RW == "mixed" {
		fmt.Fprintf(w, " = read %.1f + write %.1f", r.ReadMBps, r.WriteMBps)
	}
	fmt.Fprintf(w, ", %.0f IOPS, %s in %.2f s\n", r.IOPS, units.FormatBytes(r.Bytes), r.Seconds)
	fmt.Fprintf(w, "latency:    p50 %s, p99 %s, p99.9 %s (submit to completion)\n", latency(r.P50us), latency(r.P99us), latency(r.P999us))
	if r.DeviceIOs > 0 {
		fmt.Fprintf(w, "device:     p50 %s, p99 %s, p99.9 %s (block_rq_issue to block_rq_complete, %d requests of %s on average)\n",
			latency(r.DeviceP50us), latency(r.DeviceP99us), latency(r.DeviceP999us), r.DeviceIOs, units.FormatBytes(r.DeviceAvgBytes))
	}
	if r.TraceNote != "" {
		fmt.Fprintf(w, "trace:      %s\n", r.TraceNote)
	}
	fmt.Fprintf(w, "cpu:        %.3f s per GB (%.2f s user+sys)\n", r.CPUsPerGB, r.CPUSeconds)
	fmt.Fprintf(w, "buffers:    %s\n", r.Buffers)
	if r.BlockRequests > 0 {
		fmt.Fprintf(w, "block:      %d requests of %s on average on %s (/sys/dev/block stat deltas, other I/O to it included)\n",
			r.BlockRequests, units.FormatBytes(r.BlockAvgBytes), r.BlockDevices)
	}
	if r.BlockNote != "" {
		prefix := "block:      "
		if r.BlockRequests > 0 {
			prefix = "warning:    "
		}
		fmt.Fprintf(w, "%s%s\n", prefix, r.BlockNote)
	}
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

func sweepNVMe(c *cli.Context, base bench.NVMeOptions, run func(bench.NVMeOptions) (bench.NVMeResult, error), out io.Writer) error {
	bss, err := parseList(c.String("sweep-bs"), units.ParseBytes)
	if err != nil {
		return usagef("--sweep-bs: %v", err)
	}
	qds, err := parseList(c.String("sweep-qd"), func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
	if err != nil {
		return usagef("--sweep-qd: %v", err)
	}
	setting := func(bs, qd int64) bench.NVMeOptions {
		o := base
		o.BlockBytes, o.QueueDepth = bs, int(qd)
		if bs > 0 && o.SizeBytes%bs != 0 {
			o.SizeBytes = (o.SizeBytes/bs + 1) * bs
		}
		return o
	}
	// Refuse a bad setting before the first run, not after an hour.
	for _, bs := range bss {
		for _, qd := range qds {
			if err := setting(bs, qd).Validate(); err != nil {
				return usagef("--sweep: %v", err)
			}
		}
	}
	table := make([][]float64, len(bss))
	var results []bench.NVMeResult
	for i, bs := range bss {
		table[i] = make([]float64, len(qds))
		for j, qd := range qds {
			// Each cell is measured sweepRuns times; its median run stands.
			var runs []bench.NVMeResult
			for range sweepRuns {
				r, err := run(setting(bs, qd))
				if err != nil {
					return err
				}
				runs = append(runs, r)
			}
			slices.SortFunc(runs, func(a, b bench.NVMeResult) int { return cmp.Compare(a.MBps, b.MBps) })
			r := runs[len(runs)/2]
			table[i][j] = r.MBps
			results = append(results, r)
		}
	}
	// Within 3 % of the best, the setting with the fewest bytes in flight:
	// it holds less pinned memory for the same bandwidth.
	best := results[bench.BestNVMeSetting(results, bench.SweepTolerance)]
	fmt.Fprintf(out, "strata bench nvme --sweep: %s MB/s (1 MB = 10^6 B; each the median of %d runs), --rw %s --size %s --engine %s\n",
		"rows --bs, columns --qd,", sweepRuns, base.RW, units.FormatSize(base.SizeBytes), base.Engine)
	fmt.Fprintf(out, "%8s", "bs \\ qd")
	for _, qd := range qds {
		fmt.Fprintf(out, " %8d", qd)
	}
	fmt.Fprintln(out)
	for i, bs := range bss {
		fmt.Fprintf(out, "%8s", units.FormatSize(bs))
		for j := range qds {
			fmt.Fprintf(out, " %8.0f", table[i][j])
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "best: --bs %s --qd %d: %.0f MB/s (the fewest bytes in flight within %.0f %% of the highest); for the config:\n",
		units.FormatSize(best.BlockBytes), best.QueueDepth, best.MBps, 100*bench.SweepTolerance)
	// Only the keys strata train uses (single_submit and overlap_events
	// it accepts but does not use, and says so).
	aio := map[string]any{"aio": map[string]any{"block_size": best.BlockBytes, "queue_depth": best.QueueDepth, "thread_count": 1}}
	b, _ := json.MarshalIndent(aio, "", "  ")
	fmt.Fprintln(out, string(b))
	return nil
}

// sweepRuns is how many times --sweep measures each setting.
const sweepRuns = 3

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
