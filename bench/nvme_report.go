package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/strata-ai/strata/internal/units"
)

// FormatLatency is a latency given in microseconds as `strata bench nvme`
// prints it: µs below 1 ms, else ms.
func FormatLatency(us float64) string {
	if us < 1000 {
		return fmt.Sprintf("%.0f µs", us)
	}
	return fmt.Sprintf("%.2f ms", us/1000)
}

// ProgressLine returns an NVMeOptions.Progress that rewrites one line of w
// ("\r", no newline): bytes done of the total (or the time elapsed when the
// run is timed) and the rate so far. The run's caller clears it afterwards.
func ProgressLine(w io.Writer) func(done, total int64, elapsed time.Duration) {
	return func(done, total int64, elapsed time.Duration) {
		rate := float64(done) / 1e6 / elapsed.Seconds()
		if total > 0 {
			fmt.Fprintf(w, "\r  %s / %s  %.0f MB/s   ", units.FormatBytes(done), units.FormatBytes(total), rate)
		} else {
			fmt.Fprintf(w, "\r  %s  %v  %.0f MB/s   ", units.FormatBytes(done), elapsed.Round(time.Second), rate)
		}
	}
}

// WriteText writes what `strata bench nvme` prints for a run of o: the
// command line, the throughput, latencies, CPU time, buffers and the block
// layer's view, one labelled line each.
func (r NVMeResult) WriteText(w io.Writer, o NVMeOptions) error {
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
	fmt.Fprintf(w, "latency:    p50 %s, p99 %s, p99.9 %s (submit to completion)\n", FormatLatency(r.P50us), FormatLatency(r.P99us), FormatLatency(r.P999us))
	if r.DeviceIOs > 0 {
		fmt.Fprintf(w, "device:     p50 %s, p99 %s, p99.9 %s (block_rq_issue to block_rq_complete, %d requests of %s on average)\n",
			FormatLatency(r.DeviceP50us), FormatLatency(r.DeviceP99us), FormatLatency(r.DeviceP999us), r.DeviceIOs, units.FormatBytes(r.DeviceAvgBytes))
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
		_, err := fmt.Fprintf(w, "%s%s\n", prefix, r.BlockNote)
		return err
	}
	return nil
}

// NVMeSweepRuns is how many times SweepNVMe measures each setting when
// NVMeSweepOptions.Runs is 0.
const NVMeSweepRuns = 3

// NVMeSweepOptions are the settings `strata bench nvme --sweep` measures:
// every block size × queue depth, on a base NVMeOptions.
type NVMeSweepOptions struct {
	BlockBytes  []int64
	QueueDepths []int64
	// Runs is how many times each setting is measured (its median run
	// stands); 0 means NVMeSweepRuns.
	Runs int
	// AfterRun, when set, is called after every run with its result or
	// error (the command clears its progress line and prints --json's
	// line there).
	AfterRun func(NVMeResult, error)
}

// setting is base with block size bs and queue depth qd, its size rounded
// up to a whole number of blocks.
func (s NVMeSweepOptions) setting(base NVMeOptions, bs, qd int64) NVMeOptions {
	o := base
	o.BlockBytes, o.QueueDepth = bs, int(qd)
	if bs > 0 && o.SizeBytes%bs != 0 {
		o.SizeBytes = (o.SizeBytes/bs + 1) * bs
	}
	return o
}

// Validate refuses a sweep with a setting base's Validate refuses: before
// the first run, not after an hour.
func (s NVMeSweepOptions) Validate(base NVMeOptions) error {
	for _, bs := range s.BlockBytes {
		for _, qd := range s.QueueDepths {
			if err := s.setting(base, bs, qd).Validate(); err != nil {
				return err
			}
		}
	}
	return nil
}

// NVMeSweep is a sweep's outcome: the MB/s of each setting's median run
// (MBps[i][j] of BlockBytes[i] and QueueDepths[j]), those runs, and the
// setting recommended (BestNVMeSetting within SweepTolerance).
type NVMeSweep struct {
	Base        NVMeOptions
	BlockBytes  []int64
	QueueDepths []int64
	Runs        int
	MBps        [][]float64
	Results     []NVMeResult
	Best        NVMeResult
}

// SweepNVMe runs base at every setting of s, each s.Runs times, and
// recommends the setting with the fewest bytes in flight within
// SweepTolerance of the best MB/s. It stops at the first run's error (a
// done ctx: see RunNVMe).
func SweepNVMe(ctx context.Context, base NVMeOptions, s NVMeSweepOptions) (*NVMeSweep, error) {
	if err := s.Validate(base); err != nil {
		return nil, err
	}
	if len(s.BlockBytes) == 0 || len(s.QueueDepths) == 0 {
		return nil, fmt.Errorf("bench: a sweep needs at least one block size and one queue depth")
	}
	if s.Runs <= 0 {
		s.Runs = NVMeSweepRuns
	}
	sw := &NVMeSweep{Base: base, BlockBytes: s.BlockBytes, QueueDepths: s.QueueDepths, Runs: s.Runs,
		MBps: make([][]float64, len(s.BlockBytes))}
	for i, bs := range s.BlockBytes {
		sw.MBps[i] = make([]float64, len(s.QueueDepths))
		for j, qd := range s.QueueDepths {
			// Each cell is measured Runs times; its median run stands.
			var runs []NVMeResult
			for range s.Runs {
				r, err := RunNVMe(ctx, s.setting(base, bs, qd))
				if s.AfterRun != nil {
					s.AfterRun(r, err)
				}
				if err != nil {
					return nil, err
				}
				runs = append(runs, r)
			}
			slices.SortFunc(runs, func(a, b NVMeResult) int { return cmp.Compare(a.MBps, b.MBps) })
			r := runs[len(runs)/2]
			sw.MBps[i][j] = r.MBps
			sw.Results = append(sw.Results, r)
		}
	}
	// Within 3 % of the best, the setting with the fewest bytes in flight:
	// it holds less pinned memory for the same bandwidth.
	sw.Best = sw.Results[BestNVMeSetting(sw.Results, SweepTolerance)]
	return sw, nil
}

// AIOConfig is the config's "aio" block of the recommended setting, as
// `strata bench nvme --sweep` prints it.
func (sw *NVMeSweep) AIOConfig() map[string]any {
	// Only the keys strata train uses (single_submit and overlap_events
	// it accepts but does not use, and says so).
	return map[string]any{"aio": map[string]any{"block_size": sw.Best.BlockBytes, "queue_depth": sw.Best.QueueDepth, "thread_count": 1}}
}

// WriteText writes what `strata bench nvme --sweep` prints: the table of
// MB/s (rows block sizes, columns queue depths), the best setting, and its
// aio block for the config.
func (sw *NVMeSweep) WriteText(w io.Writer) error {
	base, best := sw.Base, sw.Best
	fmt.Fprintf(w, "strata bench nvme --sweep: %s MB/s (1 MB = 10^6 B; each the median of %d runs), --rw %s --size %s --engine %s\n",
		"rows --bs, columns --qd,", sw.Runs, base.RW, units.FormatSize(base.SizeBytes), base.Engine)
	fmt.Fprintf(w, "%8s", "bs \\ qd")
	for _, qd := range sw.QueueDepths {
		fmt.Fprintf(w, " %8d", qd)
	}
	fmt.Fprintln(w)
	for i, bs := range sw.BlockBytes {
		fmt.Fprintf(w, "%8s", units.FormatSize(bs))
		for j := range sw.QueueDepths {
			fmt.Fprintf(w, " %8.0f", sw.MBps[i][j])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "best: --bs %s --qd %d: %.0f MB/s (the fewest bytes in flight within %.0f %% of the highest); for the config:\n",
		units.FormatSize(best.BlockBytes), best.QueueDepth, best.MBps, 100*SweepTolerance)
	b, err := json.MarshalIndent(sw.AIOConfig(), "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
