package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/plan"
)

// planCommand is `strata plan`: every placement of a model on this
// machine with its memory and predicted step time, the ones that fit
// fastest first (package plan), from a machine profile measured once.
func planCommand() *cli.Command {
	return &cli.Command{
		Name:      "plan",
		Usage:     "predict memory and step time of every placement of a model on this machine, fastest that fits first",
		UsageText: "strata plan --model NAME|HF_DIR|RUN [--devices N] [--batch B] [--accum K] [--seq T] [--job full|lora|qlora [--lora r=R,alpha=A,targets=T1+T2] [--base-dtype bf16|nf4|int8]] [--nvme-path DIR] [--hbm BYTES] [--backend cpu|cuda] [--probe] [--profile FILE] [--check [--check-ranks N | --check-top K | --check-match REGEXP]] [--write-config FILE] [--json]",
		Description: "The profile (--profile FILE, else $STRATA_PROFILE, else ~/.config/strata/profile.json) holds what --probe measured on this\n" +
			"machine: host↔device copies, CPU Adam, each --nvme-path's read and write, and the model's step on the\n" +
			"devices; a missing part is measured on first use (a minute at most) and kept, a profile of other hardware\n" +
			"is refused. Each placement (ZeRO stage; optimizer state and params on the devices, in host RAM or on NVMe)\n" +
			"gets its memory per tier (strata estimate's arithmetic) and a predicted step: compute, CPU Adam,\n" +
			"host↔device copies and disk, each bytes or work over a measured rate (docs/plan.md). Placements predicted\n" +
			"within 10 % of a rank's fastest share its rank. --check trains the fastest placement of each of the first\n" +
			"3 ranks (--check-ranks), or the top K placements (--check-top), in rounds (each in turn, 2 warm-up steps\n" +
			"and 3 measured a round), prints the measured median beside the prediction and says whether the measured\n" +
			"order of the ranks is the predicted one.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Usage: "the model: a named shape, a Hugging Face model directory or a Strata run"},
			&cli.IntFlag{Name: "devices", Value: 1, Usage: "devices (ranks)"},
			&cli.IntFlag{Name: "batch", Value: 4, Usage: "rows per device per step (train_micro_batch_size_per_gpu)"},
			&cli.IntFlag{Name: "accum", Value: 1, Usage: "micro-batches per step (gradient_accumulation_steps)"},
			&cli.StringFlag{Name: "job", Value: "full", Usage: "full, lora (adapters on a frozen bf16 base) or qlora (the base nf4 unless --base-dtype)"},
			&cli.StringFlag{Name: "lora", Usage: `the LoRA job's adapters: "r=16,alpha=32,targets=q_proj+v_proj" or "targets=all-linear" (default r 16, alpha 2r, strata.lora's targets)`},
			&cli.StringFlag{Name: "base-dtype", Usage: "the LoRA job's base as stored off the devices: bf16, nf4 or int8"},
			&cli.IntFlag{Name: "seq", Value: 256, Usage: "tokens per row (default 256, or the model's max_seq_len when shorter)"},
			&cli.StringFlag{Name: "nvme-path", Usage: "a directory on the NVMe drive: adds the NVMe placements"},
			&cli.StringFlag{Name: "hbm", Usage: `each device's memory ("8GiB"; default the backend's)`},
			&cli.StringFlag{Name: "backend", Value: "cpu", Usage: "cpu or cuda"},
			&cli.BoolFlag{Name: "probe", Usage: "measure the machine again (the rates and this model's step), replacing the profile's figures"},
			&cli.StringFlag{Name: "profile", Usage: "the profile file (default $STRATA_PROFILE, else ~/.config/strata/profile.json; strata train reads it there too)"},
			&cli.BoolFlag{Name: "check", Usage: "train the top placements a few steps each and print the measured median and the prediction's error"},
			&cli.IntFlag{Name: "check-ranks", Value: 3, Usage: "with --check: run the fastest placement of each of the first N ranks"},
			&cli.IntFlag{Name: "check-top", Usage: "with --check: run the top K placements instead, ties included (the error table)"},
			&cli.StringFlag{Name: "check-match", Usage: `with --check: run the placements whose names match this regular expression instead ("resident$|NVMe$")`},
			&cli.IntFlag{Name: "check-rounds", Value: 3, Usage: "with --check: rounds, each running every placement in turn (2 warm-up steps, 3 measured)"},
			&cli.StringFlag{Name: "write-config", Usage: "write the config of the fastest placement that fits to this file"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: runPlan,
	}
}

func runPlan(c *cli.Context) error {
	if c.Args().Present() {
		return usagef("plan: unexpected argument %q", c.Args().First())
	}
	if !c.IsSet("model") {
		return usagef("plan: --model is needed (a named shape, a Hugging Face directory or a Strata run)")
	}
	shape, err := estimateShape(c.String("model"))
	if err != nil {
		return err
	}
	job, err := plan.ParseJob(c.String("job"), c.String("lora"), c.String("base-dtype"), shape)
	if err != nil {
		return usagef("%v", err)
	}
	o := plan.Options{Model: c.String("model"), Shape: shape, Job: job, Accum: c.Int("accum"), Devices: c.Int("devices"), Batch: c.Int("batch"), Seq: c.Int("seq"),
		NVMePath: c.String("nvme-path"), Backend: c.String("backend"), Probe: c.Bool("probe"), ProfilePath: c.String("profile"),
		Check: c.Bool("check"), CheckRanks: c.Int("check-ranks"), CheckTop: c.Int("check-top"), CheckRounds: c.Int("check-rounds"),
		Progress: func(line string) { fmt.Fprintln(c.App.ErrWriter, line) }}
	if !c.IsSet("seq") {
		o.Seq = min(o.Seq, shape.MaxSeq)
	}
	if o.Devices < 1 || o.Batch < 1 || o.Accum < 1 || o.Seq < 1 || o.Seq > shape.MaxSeq {
		return usagef("plan: --devices %d, --batch %d and --accum %d must be >= 1, --seq %d within 1..%d (the model's max_seq_len)", o.Devices, o.Batch, o.Accum, o.Seq, shape.MaxSeq)
	}
	if m := c.String("check-match"); m != "" {
		if o.CheckMatch, err = regexp.Compile(m); err != nil {
			return usagef("plan: --check-match: %v", err)
		}
	}
	if c.IsSet("hbm") {
		if o.HBMBytes, err = units.ParseBytes(c.String("hbm")); err != nil {
			return usagef("plan: --hbm: %v", err)
		}
	}
	r, err := plan.Run(c.Context, o)
	if pe := (*plan.NVMePathError)(nil); errors.As(err, &pe) {
		return usagef("plan: --nvme-path: %v", pe.Err)
	}
	if err != nil {
		return err
	}
	if !r.Fits {
		if err := r.WriteText(c.App.Writer); err != nil {
			return err
		}
		return fmt.Errorf("plan: %s does not fit this machine in any placement", o.Model)
	}
	if w := c.String("write-config"); w != "" {
		if err := os.WriteFile(w, []byte(r.BestConfigJSON()), 0o644); err != nil {
			return fmt.Errorf("plan: --write-config: %w", err)
		}
	}
	if c.Bool("json") {
		b, err := json.MarshalIndent(r.JSON(), "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(c.App.Writer, string(b))
		return err
	}
	if err := r.WriteText(c.App.Writer); err != nil {
		return err
	}
	if w := c.String("write-config"); w != "" {
		fmt.Fprintf(c.App.Writer, "wrote the config of %q to %s\n", r.Predictions[0].Name, w)
	}
	return nil
}
