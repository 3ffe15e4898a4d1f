package cmd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/shard"
)

// planCommand is `strata plan`: every placement of a model on this
// machine with its memory and predicted step time, the ones that fit
// fastest first (package plan), from a machine profile measured once.
func planCommand() *cli.Command {
	return &cli.Command{
		Name:      "plan",
		Usage:     "predict memory and step time of every placement of a model on this machine, fastest that fits first",
		UsageText: "strata plan --model NAME|HF_DIR|RUN [--devices N] [--batch B] [--seq T] [--nvme-path DIR] [--hbm BYTES] [--backend cpu|cuda] [--probe] [--profile FILE] [--check [--check-ranks N | --check-top K]] [--write-config FILE] [--json]",
		Description: "The profile (--profile, default ~/.config/strata/profile.json) holds what --probe measured on this\n" +
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
			&cli.IntFlag{Name: "seq", Value: 256, Usage: "tokens per row (default 256, or the model's max_seq_len when shorter)"},
			&cli.StringFlag{Name: "nvme-path", Usage: "a directory on the NVMe drive: adds the NVMe placements"},
			&cli.StringFlag{Name: "hbm", Usage: `each device's memory ("8GiB"; default the backend's)`},
			&cli.StringFlag{Name: "backend", Value: "cpu", Usage: "cpu or cuda"},
			&cli.BoolFlag{Name: "probe", Usage: "measure the machine again (the rates and this model's step), replacing the profile's figures"},
			&cli.StringFlag{Name: "profile", Usage: "the profile file (default ~/.config/strata/profile.json)"},
			&cli.BoolFlag{Name: "check", Usage: "train the top placements a few steps each and print the measured median and the prediction's error"},
			&cli.IntFlag{Name: "check-ranks", Value: 3, Usage: "with --check: run the fastest placement of each of the first N ranks"},
			&cli.IntFlag{Name: "check-top", Usage: "with --check: run the top K placements instead, ties included (the error table)"},
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
	in := plan.Inputs{Model: c.String("model"), Shape: shape, Devices: c.Int("devices"), Batch: c.Int("batch"), Seq: c.Int("seq"),
		NVMePath: c.String("nvme-path"), SharedCores: c.String("backend") == "cpu"}
	if !c.IsSet("seq") {
		in.Seq = min(in.Seq, shape.MaxSeq)
	}
	if in.Devices < 1 || in.Batch < 1 || in.Seq < 1 || in.Seq > shape.MaxSeq {
		return usagef("plan: --devices %d and --batch %d must be >= 1, --seq %d within 1..%d (the model's max_seq_len)", in.Devices, in.Batch, in.Seq, shape.MaxSeq)
	}
	var hbm int64
	if c.IsSet("hbm") {
		if hbm, err = units.ParseBytes(c.String("hbm")); err != nil {
			return usagef("plan: --hbm: %v", err)
		}
	}
	devs, err := backend.Open(c.String("backend"), 1, hbm, true)
	if err != nil {
		return err
	}
	in.HBMBytes = devs.Devs[0].MemStats().BudgetBytes
	machine := plan.ThisMachine(c.String("backend"), devs.Devs[0].Name())
	devs.Close()
	if avail, ok := hostmem.Available(hostmem.MeminfoPath); ok {
		in.HostBytes = avail
	}
	if in.NVMePath != "" {
		if in.NVMeFreeBytes, err = bench.NVMeRoom(in.NVMePath); err != nil {
			return usagef("plan: --nvme-path: %v", err)
		}
	}
	fits, err := plan.Fit(in)
	if err != nil {
		return err
	}
	first := -1
	for i, f := range fits {
		if f.Fits {
			first = i
			break
		}
	}
	if first < 0 {
		return nothingFits(c.App.Writer, in, fits)
	}

	path := c.String("profile")
	if path == "" {
		if path, err = plan.DefaultPath(); err != nil {
			return err
		}
	}
	p, err := plan.Load(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || c.Bool("probe"):
		p = plan.NewProfile(machine)
	case err != nil:
		return err
	default:
		if err := p.Check(machine); err != nil {
			return fmt.Errorf("%w: %s", err, path)
		}
	}
	stderr := c.App.ErrWriter
	changed := false
	// The model's step first, on a quiet heap, then the rates.
	cm, ok := p.Compute(in.Model, in.Devices, in.Batch, in.Seq)
	if !ok {
		fmt.Fprintf(stderr, "plan: measuring a step of %s (%s) ...\n", in.Model, fits[first].Name)
		if cm, err = bench.ProbeCompute(fits[first].Config, in, c.String("backend")); err != nil {
			return err
		}
		if fits[first].Checkpoint { // only checkpointed placements fit: that is the step
			cm.CheckpointFwdBwdSeconds = cm.FwdBwdSeconds
		}
		for _, f := range fits {
			if f.Fits && f.Optimizer == shard.Host && f.Params == shard.HBM && f.Checkpoint == fits[first].Checkpoint {
				fmt.Fprintf(stderr, "plan: measuring a step of %s (%s) ...\n", in.Model, f.Name)
				if err := bench.ProbeOffload(&cm, f.Config, in, c.String("backend")); err != nil {
					return err
				}
				break
			}
		}
		p.SetCompute(cm)
		changed = true
	}
	if cm.CheckpointFwdBwdSeconds == 0 && !fits[first].Checkpoint {
		ck := fits[first].Config
		ck.Name, ck.Checkpoint = ck.Name+", activation checkpointing", true
		fmt.Fprintf(stderr, "plan: measuring a step of %s (%s) ...\n", in.Model, ck.Name)
		if err := bench.ProbeCheckpoint(&cm, ck, in, c.String("backend")); err != nil {
			return err
		}
		p.SetCompute(cm)
		changed = true
	}
	if p.AdamParamsPerS == 0 || p.CopyBytesPerS == 0 || p.AdamRate(plan.NarrowMoments, plan.NarrowMaster) == 0 {
		fmt.Fprintln(stderr, "plan: measuring host↔device copies and CPU Adam ...")
		if err := bench.ProbeRates(p, c.String("backend"), hbm, 0); err != nil {
			return err
		}
		changed = true
	}
	if _, ok := p.Disk(in.NVMePath); in.NVMePath != "" && !ok {
		fmt.Fprintf(stderr, "plan: measuring %s (256 MiB written, then read) ...\n", in.NVMePath)
		d, err := bench.ProbeDisk(context.Background(), in.NVMePath, 0)
		if err != nil {
			return err
		}
		p.SetDisk(d)
		changed = true
	}
	if changed {
		if err := p.Save(path); err != nil {
			return err
		}
	}
	preds, err := plan.Predict(p, in)
	if err != nil {
		return err
	}
	measured := map[string]float64{}
	if c.Bool("check") {
		// Round by round, each placement in turn (2 warm-up steps, 3
		// measured), so that the host's drifts fall on all of them alike;
		// the median of every round's steps.
		top := plan.RankLeaders(preds, c.Int("check-ranks"))
		if k := c.Int("check-top"); k > 0 {
			top = nil
			for i, pr := range preds {
				if i < k && pr.Fits {
					top = append(top, pr)
				}
			}
		}
		steps := map[string][]float64{}
		rounds := max(c.Int("check-rounds"), 1)
		for r := range rounds {
			for _, pr := range top {
				fmt.Fprintf(stderr, "plan: round %d/%d: %s ...\n", r+1, rounds, pr.Name)
				s, err := bench.TimeConfig(pr.Config, in, c.String("backend"), 2, 3)
				if err != nil {
					return err
				}
				steps[pr.Name] = append(steps[pr.Name], s...)
			}
		}
		for name, s := range steps {
			slices.Sort(s)
			measured[name] = s[len(s)/2]
		}
	}
	if w := c.String("write-config"); w != "" {
		if err := os.WriteFile(w, []byte(plan.ConfigJSON(preds[0].Config, in)), 0o644); err != nil {
			return fmt.Errorf("plan: --write-config: %w", err)
		}
	}
	if c.Bool("json") {
		return printPlanJSON(c.App.Writer, in, path, preds, measured)
	}
	printPlan(c.App.Writer, in, path, p, preds, measured)
	if w := c.String("write-config"); w != "" {
		fmt.Fprintf(c.App.Writer, "wrote the config of %q to %s\n", preds[0].Name, w)
	}
	return nil
}

// nothingFits prints every placement's shortfall and returns the error
// naming the closest one.
func nothingFits(w io.Writer, in plan.Inputs, fits []plan.Prediction) error {
	fmt.Fprintf(w, "strata plan: %s (%s params) on %d device(s) of %s, batch %d × %d tokens: no placement fits\n",
		in.Model, paramWords(in.Shape.ParamCount()), in.Devices, units.FormatBytes(in.HBMBytes), in.Batch, in.Seq)
	for _, f := range fits {
		fmt.Fprintf(w, "  %-44s %s\n", f.Name+":", f.Short)
	}
	if in.NVMePath == "" {
		fmt.Fprintln(w, "  (no --nvme-path: the NVMe placements were not considered)")
	}
	return fmt.Errorf("plan: %s does not fit this machine in any placement", in.Model)
}

func printPlan(w io.Writer, in plan.Inputs, path string, p *plan.Profile, preds []plan.Prediction, measured map[string]float64) {
	fmt.Fprintf(w, "strata plan: %s (%s params) on %d device(s) of %s, batch %d × %d tokens\n", in.Model,
		paramWords(in.Shape.ParamCount()), in.Devices, units.FormatBytes(in.HBMBytes), in.Batch, in.Seq)
	fmt.Fprintf(w, "profile %s (measured %s): copies %.2f GB/s, CPU Adam %.0f M params/s (%d threads)", path, p.Created,
		p.CopyBytesPerS/1e9, p.AdamParamsPerS/1e6, p.AdamThreads)
	if d, ok := p.Disk(in.NVMePath); ok {
		fmt.Fprintf(w, ", %s read %.2f GB/s write %.2f GB/s", d.Path, d.ReadBytesPerS/1e9, d.WriteBytesPerS/1e9)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "rank\tplacement\tpredicted\tbottleneck\tcompute\tadam\tcopies\tstaging\tdisk\tdevice\thost\tnvme"
	if len(measured) > 0 {
		head += "\tmeasured\terror"
	}
	fmt.Fprintln(tw, head)
	var short []plan.Prediction
	for _, pr := range preds {
		if !pr.Fits {
			short = append(short, pr)
			continue
		}
		t := pr.Terms
		line := fmt.Sprintf("%d\t%s\t%.3f s\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\t%s", pr.Rank, pr.Name, pr.StepSeconds, pr.Bottleneck,
			t["compute"], t["adam"], t["copy"], t["staging"], t["disk"], units.FormatBytes(pr.DeviceBytes), units.FormatBytes(pr.HostBytes), units.FormatBytes(pr.NVMeBytes))
		if m, ok := measured[pr.Name]; ok {
			line += fmt.Sprintf("\t%.3f s\t%+.0f%%", m, 100*(pr.StepSeconds-m)/m)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	for _, pr := range short {
		fmt.Fprintf(w, "does not fit: %s: %s\n", pr.Name, pr.Short)
	}
	if len(measured) > 1 {
		fmt.Fprintf(w, "ranking measured: %s\n", measuredRanking(preds, measured))
		pairs, bad := rankingPairs(preds, measured)
		switch {
		case pairs == 0:
			fmt.Fprintln(w, "ranking: the placements run share one rank (predicted within 10 %): no order to check")
		case bad == 0:
			fmt.Fprintf(w, "ranking: matches: every pair of placements of different ranks measured in the predicted order (%d pairs)\n", pairs)
		default:
			fmt.Fprintf(w, "ranking: does not match: %d of %d pairs of placements of different ranks measured in the other order\n", bad, pairs)
		}
	}
}

// rankingPairs counts the pairs of measured placements of different
// ranks, and of those the pairs whose measured medians are in the other
// order than their ranks.
func rankingPairs(preds []plan.Prediction, measured map[string]float64) (pairs, bad int) {
	for i, a := range preds {
		ma, ok := measured[a.Name]
		if !ok {
			continue
		}
		for _, b := range preds[i+1:] {
			mb, ok := measured[b.Name]
			if !ok || a.Rank == b.Rank {
				continue
			}
			pairs++
			if (a.Rank < b.Rank) != (ma < mb) {
				bad++
			}
		}
	}
	return pairs, bad
}

// measuredRanking is the checked placements in the order of their
// measured medians, each with its predicted rank.
func measuredRanking(preds []plan.Prediction, measured map[string]float64) string {
	var rs []plan.Prediction
	for _, pr := range preds {
		if _, ok := measured[pr.Name]; ok {
			rs = append(rs, pr)
		}
	}
	slices.SortStableFunc(rs, func(a, b plan.Prediction) int { return cmp.Compare(measured[a.Name], measured[b.Name]) })
	var parts []string
	for _, pr := range rs {
		parts = append(parts, fmt.Sprintf("%s (rank %d, %.3f s)", pr.Name, pr.Rank, measured[pr.Name]))
	}
	return strings.Join(parts, " < ")
}

func printPlanJSON(w io.Writer, in plan.Inputs, path string, preds []plan.Prediction, measured map[string]float64) error {
	type cfgJSON struct {
		plan.Prediction
		Measured *float64 `json:"measured_step_s,omitempty"`
		Error    *float64 `json:"error,omitempty"` // (predicted − measured) / measured
	}
	out := struct {
		Model   string    `json:"model"`
		Params  int64     `json:"params"`
		Devices int       `json:"devices"`
		Batch   int       `json:"batch"`
		Seq     int       `json:"seq"`
		Profile string    `json:"profile"`
		Configs []cfgJSON `json:"configs"`
		// With --check: the pairs of measured placements of different
		// ranks, and how many of them were measured in the other order.
		RankPairs      *int `json:"ranking_pairs,omitempty"`
		RankMismatches *int `json:"ranking_mismatches,omitempty"`
	}{Model: in.Model, Params: in.Shape.ParamCount(), Devices: in.Devices, Batch: in.Batch, Seq: in.Seq, Profile: path}
	if len(measured) > 0 {
		pairs, bad := rankingPairs(preds, measured)
		out.RankPairs, out.RankMismatches = &pairs, &bad
	}
	for _, pr := range preds {
		cj := cfgJSON{Prediction: pr}
		if m, ok := measured[pr.Name]; ok {
			e := (pr.StepSeconds - m) / m
			cj.Measured, cj.Error = &m, &e
		}
		if math.IsNaN(cj.StepSeconds) {
			cj.StepSeconds = 0
		}
		out.Configs = append(out.Configs, cj)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// paramWords is a parameter count as people say it: 124.4M, 6.50B.
func paramWords(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	}
	return groupDigits(n)
}
