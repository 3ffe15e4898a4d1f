package cmd

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/internal/units"
)

// benchStepCommand is `strata bench step`: one model and batch with
// everything resident, offloaded to host RAM and offloaded to NVMe, run
// alternately, with the ratios of their median step times.
func benchStepCommand() *cli.Command {
	return &cli.Command{
		Name:  "step",
		Usage: "ZeRO-3 step time with everything resident, offloaded to host, and offloaded to NVMe (ratios)",
		Description: "Builds three engines on the same model and batch (stage 3, CPU backend or --backend cuda): resident\n" +
			"(nothing offloaded), host (offload_param and offload_optimizer cpu) and nvme (offload_param nvme,\n" +
			"the optimizer state in host RAM, or on NVMe too with --nvme-optimizer), and steps them alternately:\n" +
			"one step of each per round, so the machine's noise falls on all three. Prints the median step\n" +
			"times, the ratios nvme/host and host/resident, the prefetch hit rate, stalls and bytes per link.\n" +
			"--overlap serial,exact,dpu runs each offloaded mode with each host optimizer schedule, alternately, and\n" +
			"prints cpu adam's time, the part of it no compute stream hid (exposed), the same for the optimizer\n" +
			"state's I/O waits, and the step time over serial's (dpu: delayed parameter update, its warm-up steps\n" +
			"exact; backward: exact with strata.update_in_backward, cpu adam begun in the backward as if the step were\n" +
			"not clipped). --clip sets every engine's gradient_clipping (default 1.0; 0: none).\n" +
			"--modes offload is ZeRO-Offload: optimizer state in host RAM, params on the device.\n" +
			"--moments fp32,int8 runs each offloaded mode with each precision of Adam's moments, alternately, and\n" +
			"prints each narrow run's step time and NVMe bytes per step over the fp32 run's; a precision followed by\n" +
			"+remainder (int8+remainder) keeps the master as the bf16 param plus a remainder (bf16+remainder).\n" +
			"--train full,lora runs each with LoRA too (strata.lora of --lora-rank on every linear, the base frozen: no\n" +
			"weight-gradient GEMMs, no optimizer state for it) and prints each LoRA run's step over the full run's.\n" +
			"The default model (medium, 6.4M params, 4x256 tokens per device) is bound by compute, not by the disk.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "nvme-path", Value: "/var/tmp", Usage: "directory for the swap file (on the drive to measure; removed after)"},
			&cli.StringFlag{Name: "model", Value: "medium", Usage: "model shape (tiny, small, medium, gpt2, gpt-2b, ...)"},
			&cli.IntFlag{Name: "devices", Value: 1, Usage: "devices (ranks)"},
			&cli.StringFlag{Name: "backend", Value: "cpu", Usage: "device backend: cpu, or cuda (NVIDIA GPUs through the driver API; more devices than GPUs share them)"},
			&cli.IntFlag{Name: "batch", Value: 4, Usage: "rows per device per step"},
			&cli.IntFlag{Name: "seq", Value: 256, Usage: "tokens per row"},
			&cli.IntFlag{Name: "steps", Value: 5, Usage: "measured steps per mode"},
			&cli.IntFlag{Name: "warmup", Value: 2, Usage: "steps per mode before measuring (the first records the trace)"},
			&cli.IntFlag{Name: "block", Value: 3, Usage: "steps each mode takes in a row per measured round, the first not measured (1: alternate every step)"},
			&cli.BoolFlag{Name: "nvme-optimizer", Usage: "nvme mode: optimizer state on NVMe too (strata.host_budget keeps part in RAM)"},
			&cli.StringFlag{Name: "host-budget", Usage: "nvme mode: strata.host_budget, e.g. 8GiB (default: the tier store's minimum)"},
			&cli.StringFlag{Name: "hbm", Value: "8GiB", Usage: "per-device memory budget"},
			&cli.StringFlag{Name: "tier-hbm", Usage: "offloaded modes: the tier store's share of each device (default: what is left)"},
			&cli.StringFlag{Name: "modes", Value: "resident,host,nvme", Usage: "modes to run, comma-separated: resident, host, nvme, offload (params on the device, optimizer state in host RAM)"},
			&cli.StringFlag{Name: "train", Value: "full", Usage: "what each run trains, comma-separated: full (every weight), lora (adapters of --lora-rank on every linear, the base frozen), qlora (the same, the base stored in NF4: host and nvme modes)"},
			&cli.IntFlag{Name: "lora-rank", Value: 16, Usage: "--train lora: the adapters' rank (alpha twice it)"},
			&cli.StringFlag{Name: "moments", Value: "fp32", Usage: "precisions of Adam's moments each offloaded mode runs with (strata.optimizer_state.moments), comma-separated: fp32, bf16, int8 (with the fp32 master, in every mode); +remainder after one: the master as bf16+remainder (the default of strata train with the optimizer on NVMe)"},
			&cli.StringFlag{Name: "overlap", Value: "exact", Usage: "host optimizer schedules each offloaded mode runs with (strata.overlap), comma-separated: serial (the optimizer after the step, the reference), exact (under the next step), dpu (delayed parameter update), backward (exact with strata.update_in_backward: cpu adam begins in the backward)"},
			&cli.Float64Flag{Name: "clip", Value: 1.0, Usage: "gradient_clipping of every engine (0: none)"},
			&cli.IntFlag{Name: "threads", Usage: "cpuadam threads (default GOMAXPROCS)"},
			&cli.StringFlag{Name: "probe-size", Usage: "the file the disk probe under --nvme-path writes, reads and mixes before the steps, for the drive's rates in the resources table (default: the run's NVMe working set, the estimate's NVMe homes, at least 2GiB: a smaller file can be served by a cache in front of the drive)"},
			&cli.BoolFlag{Name: "summary", Usage: "print each engine's summary (memory per device, tiers)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			&cli.StringFlag{Name: "trace", Usage: "write the last mode's Chrome trace-event timeline to FILE (use with one mode: --modes nvme)"},
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("bench step: unexpected argument %q", c.Args().First())
			}
			o := bench.StepOptions{
				Model: c.String("model"), Devices: c.Int("devices"), Backend: c.String("backend"), Batch: c.Int("batch"), Seq: c.Int("seq"),
				Steps: c.Int("steps"), Warmup: c.Int("warmup"), Block: c.Int("block"), NVMePath: c.String("nvme-path"),
				NVMeOptimizer: c.Bool("nvme-optimizer"), Threads: c.Int("threads"), GradientClipping: c.Float64("clip"),
				Modes: strings.Split(c.String("modes"), ","), Overlaps: strings.Split(c.String("overlap"), ","), Moments: strings.Split(c.String("moments"), ","), TracePath: c.String("trace"),
				Trains: strings.Split(c.String("train"), ","), LoRARank: c.Int("lora-rank"),
			}
			for _, f := range []struct {
				name string
				dst  *int64
			}{{"host-budget", &o.HostBudgetBytes}, {"hbm", &o.HBMBytes}, {"tier-hbm", &o.TierHBMBytes}, {"probe-size", &o.ProbeBytes}} {
				if v := c.String(f.name); v != "" {
					n, err := units.ParseBytes(v)
					if err != nil {
						return usagef("--%s: %v", f.name, err)
					}
					*f.dst = n
				}
			}
			if err := o.WithDefaults().Validate(); err != nil {
				return usagef("%v", err)
			}
			res, err := bench.Step(o)
			if err != nil {
				return err
			}
			w := c.App.Writer
			if c.Bool("json") {
				b, err := json.Marshal(res.JSON())
				if err != nil {
					return err
				}
				fmt.Fprintln(w, string(b))
				return nil
			}
			fmt.Fprint(w, res.String())
			if c.Bool("summary") {
				for _, m := range res.Modes {
					fmt.Fprintf(w, "\n== %s\n%s", m.Name(), formatSummary(m.Summary))
				}
			}
			return nil
		},
	}
}
