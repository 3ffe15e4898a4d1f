package estimate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// The table `strata estimate` prints: a Report as text.

// WriteText writes r as the tables `strata estimate` prints: the model
// state per stage beside the ZeRO paper's formulas, the one stage's bytes
// by state, and with a shape the activations, the totals per device and
// which configuration fits the budget.
func (r *Report) WriteText(w io.Writer) error {
	ew := &units.ErrWriter{W: w}
	writeModelState(ew, r.Description, r.Options, r.Stages, r.Breakdown)
	if r.Activations == nil {
		fmt.Fprintln(ew, "not included: activations and the working set (they need a shape: --model or --config)")
	} else {
		r.Activations.write(ew)
	}
	return ew.Err
}

// machineCoef turns a per-rank formula into the formula for all N ranks.
func machineCoef(c Coef, n int) Coef {
	return Coef{Full: c.Full*float64(n) + c.PerN, TrainFull: c.TrainFull*float64(n) + c.TrainPerN}
}

// nodeCoef is c (one rank's) summed over one node's l ranks of the job's n:
// each node holds 1/(n/l) of the sharded terms.
func nodeCoef(c Coef, l, n int) Coef {
	nodes := float64(n / l)
	return Coef{Full: c.Full*float64(l) + c.PerN/nodes, TrainFull: c.TrainFull*float64(l) + c.TrainPerN/nodes}
}

func tierWord(t shard.Tier) string {
	switch t {
	case shard.Host:
		return "host (cpu)"
	case shard.NVMe:
		return "nvme"
	}
	return "device (none)"
}

func writeModelState(w io.Writer, what string, o Options, stages []Stage, breakdown bool) {
	fmt.Fprintf(w, "%s\n", what)
	nodes := o.Devices / o.Local()
	if nodes > 1 {
		fmt.Fprintf(w, "N = %d devices (%d nodes × %d); optimizer state on %s; param shards on %s", o.Devices, nodes, o.Local(), tierWord(o.OptimizerTier), tierWord(o.ParamTier))
	} else {
		fmt.Fprintf(w, "N = %d devices; optimizer state on %s; param shards on %s", o.Devices, tierWord(o.OptimizerTier), tierWord(o.ParamTier))
	}
	if o.OptimizerTier != shard.HBM {
		fmt.Fprintf(w, "; reduced gradient shards copied to the host in %s", o.HostGradDType)
	}
	if o.HostBudgetBytes > 0 {
		fmt.Fprintf(w, "; host_budget %s", units.FormatBytes(o.HostBudgetBytes))
	}
	fmt.Fprintln(w)
	master := "fp32 master"
	if o.StateDType(shard.Master) == dtype.Rem16 {
		master = "master as the bf16 param + a 16-bit remainder and a bit"
	}
	if md := o.StateDType(shard.AdamM); md == dtype.F32 && master == "fp32 master" {
		fmt.Fprintf(w, "mixed-precision Adam: bf16 params and grads, fp32 master, m, v (16 B/param)")
	} else {
		fmt.Fprintf(w, "mixed-precision Adam: bf16 params and grads, %s, %s m and v (%.4g B/param of optimizer state, %.4g in all)", master, MomentsName(md), o.OptimizerBytesPerParam(), 4+o.OptimizerBytesPerParam())
	}
	fmt.Fprintf(w, "; each rank's slice of a chunk padded to %d elements\n\n", o.ShardAlignElems)
	notes := writeStageTable(w, o, stages)
	if ok := okStage(stages); ok != nil {
		pad := float64(ok.RankElems*int64(o.Devices)-ok.Params) / float64(ok.Params) * 100
		fmt.Fprintf(w, "\npadding: %s elements per gathered copy beyond Ψ (%+.3f%%); Ψ = %s\n",
			groupDigits(ok.PaddedElems-ok.Params), pad, groupDigits(ok.Params))
	}
	if breakdown {
		writeBreakdown(w, stages)
	}
	for _, n := range notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w, "\nbinary units (GiB = 2^30 B; GB = 10^9 B); --json gives exact bytes")
}

// writeStageTable writes a line per stage: per device, host and NVMe
// beside their formulas; it returns the stages' notes.
func writeStageTable(w io.Writer, o Options, stages []Stage) []string {
	nodes := o.Devices / o.Local()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	frozen := o.Frozen != nil
	head := "stage\tper device\tformula\thost (all ranks)\tformula\tnvme (all ranks)\tformula"
	if nodes > 1 {
		head = "stage\tper device\tformula\thost (per node)\tformula\tnvme (per node)\tformula"
	}
	if frozen {
		head += "\tnot kept, frozen (device, host, nvme)"
	}
	fmt.Fprintln(tw, head)
	var notes []string
	for _, s := range stages {
		if s.Err != nil {
			fmt.Fprintf(tw, "%d\tn/a\t\tn/a\t\tn/a\t\n", s.Stage)
			notes = append(notes, fmt.Sprintf("stage %d: %s", s.Stage, strings.TrimPrefix(s.Err.Error(), "engine: estimate: ")))
			continue
		}
		n := o.Devices
		dev := units.FormatBytes(s.DeviceBytes())
		if s.DeviceBytes() >= 100e6 {
			dev += fmt.Sprintf(" (%.1f GB)", float64(s.DeviceBytes())/1e9)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s", s.Stage, dev, s.TierFormula(shard.HBM),
			units.FormatBytes(s.NodeHostBytes()), nodeCoef(s.TierFormula(shard.Host), o.Local(), n),
			units.FormatBytes(s.NodeNVMeBytes()), nodeCoef(s.TierFormula(shard.NVMe), o.Local(), n))
		if frozen {
			fmt.Fprintf(tw, "\t%s, %s, %s", units.FormatBytes(s.FrozenSavedBytes(shard.HBM)/int64(n)),
				units.FormatBytes(s.FrozenSavedBytes(shard.Host)), units.FormatBytes(s.FrozenSavedBytes(shard.NVMe)))
		}
		fmt.Fprintln(tw)
		for _, note := range s.Notes {
			notes = append(notes, fmt.Sprintf("stage %d: %s", s.Stage, note))
		}
	}
	tw.Flush()
	return notes
}

// writeBreakdown writes each stage's bytes of one rank by state.
func writeBreakdown(w io.Writer, stages []Stage) {
	for _, s := range stages {
		if s.Err != nil {
			continue
		}
		fmt.Fprintf(w, "\nstage %d, one rank, by state:\n", s.Stage)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "state\tdevice\thost\tnvme\tformula")
		for st := range shard.StateCount {
			if shard.State(st) == shard.Activation {
				continue // not model state: the activation section
			}
			var fs []string
			for t := range shard.TierCount {
				if f := s.Formula[st][t]; f != (Coef{}) {
					fs = append(fs, fmt.Sprintf("%s on %s", f, shard.Tier(t)))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", shard.State(st),
				units.FormatBytes(s.PerRank[st][shard.HBM]), units.FormatBytes(s.PerRank[st][shard.Host]),
				units.FormatBytes(s.PerRank[st][shard.NVMe]), strings.Join(fs, ", "))
		}
		tw.Flush()
	}
}

func okStage(stages []Stage) *Stage {
	for i := range stages {
		if stages[i].Err == nil {
			return &stages[i]
		}
	}
	return nil
}

func bytesCell(n int64) string {
	if n == 0 {
		return "-"
	}
	s := units.FormatBytes(n)
	if n >= 100e6 {
		s += fmt.Sprintf(" (%.1f GB)", float64(n)/1e9)
	}
	return s
}

func (a *ActivationReport) write(w io.Writer) {
	dt := a.Configs[0].Est.Options.DType
	fmt.Fprintf(w, "\nactivations per device, micro-batch %d × %d tokens, %s activations (fp32 norm and softmax statistics, loss chunk and residual gradient):\n",
		a.Micro, a.Seq, strings.ToLower(dt.String()))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "term"
	for _, k := range a.Configs {
		head += "\t" + k.Name
	}
	fmt.Fprintln(tw, head)
	for _, n := range ActivationTermOrder {
		row := n
		for _, k := range a.Configs {
			var b int64
			for _, t := range k.Est.AllTerms() {
				if t.Name == n {
					b = t.Bytes
				}
			}
			row += "\t" + bytesCell(b)
		}
		fmt.Fprintln(tw, row)
	}
	row, host := "activations per device", "saved block inputs in host memory, per device"
	for _, k := range a.Configs {
		row += "\t" + bytesCell(k.Est.DeviceBytes())
		host += "\t" + bytesCell(k.Est.HostInputBytes)
	}
	fmt.Fprintln(tw, row)
	fmt.Fprintln(tw, host)
	tw.Flush()
	ck := a.Configs[1].Est.Options.Checkpoint
	fmt.Fprintf(w, "checkpointing: %d of %d blocks recomputed in the backward from their saved input; cpu_checkpointing keeps those inputs in pinned host memory (the tier store brings each back ahead of its block's backward)\n", ck, a.Shape.Layers)
	if len(a.Totals) == 0 {
		return
	}
	a.writeTotals(w)
}

// writeTotals writes each stage's total per device and which
// configuration fits the budget.
func (a *ActivationReport) writeTotals(w io.Writer) {
	fmt.Fprintln(w, "\nper device: model state + working set + activations")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "stage\tmodel state\tworking set"
	for _, k := range a.Configs {
		head += "\t" + k.Name
	}
	fmt.Fprintln(tw, head)
	for _, st := range a.Totals {
		row := fmt.Sprintf("%d\t%s\t%s", st.Stage, bytesCell(st.ModelState), bytesCell(st.Working.Bytes()))
		for _, t := range st.Totals {
			cell := bytesCell(t)
			if a.BudgetBytes > 0 {
				if t <= a.BudgetBytes {
					cell += " fits"
				} else {
					cell += " over"
				}
			}
			row += "\t" + cell
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
	for _, st := range a.Totals {
		var parts []string
		for _, t := range st.Working.Terms() {
			parts = append(parts, fmt.Sprintf("%s %s", t.Name, units.FormatBytes(t.Bytes)))
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "working set, stage %d: %s\n", st.Stage, strings.Join(parts, ", "))
		}
	}
	if a.BudgetBytes == 0 {
		fmt.Fprintln(w, "give --hbm (the device budget) to see which configuration fits")
		return
	}
	stage, k, total, ok := a.Fit()
	if ok {
		fmt.Fprintf(w, "fits in %s per device: stage %d with %s (%s) (the table marks every configuration that fits)\n",
			units.FormatBytes(a.BudgetBytes), stage, a.ConfigPhrase(k), units.FormatBytes(total))
		return
	}
	fmt.Fprintf(w, "nothing fits in %s per device: the least is stage %d with %s (%s); use more devices (--devices), offload (--offload-optimizer, --offload-param), or a smaller --batch or --seq\n",
		units.FormatBytes(a.BudgetBytes), stage, a.ConfigPhrase(k), units.FormatBytes(total))
}
