package plan

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
)

// A Result as `strata plan` prints it: the table, and the JSON of --json
// from tagged structs.

// WriteText writes r as `strata plan`'s table: each placement that fits
// with its predicted step, its terms and its memory (and with a check the
// measured median and the ranking's verdict), then those that do not fit;
// when nothing fits, every placement's shortfall.
func (r *Result) WriteText(w io.Writer) error {
	ew := &units.ErrWriter{W: w}
	if !r.Fits {
		r.writeNoFit(ew)
	} else {
		r.writeTable(ew)
	}
	return ew.Err
}

// writeNoFit writes every placement's shortfall.
func (r *Result) writeNoFit(w io.Writer) {
	in := r.Inputs
	fmt.Fprintf(w, "strata plan: %s (%s) on %d device(s) of %s, batch %d × %d tokens: no placement fits\n",
		in.Model, shapeParams(in.Shape), in.Devices, units.FormatBytes(in.HBMBytes), in.Batch, in.Seq)
	for _, f := range r.Predictions {
		fmt.Fprintf(w, "  %-44s %s\n", f.Name+":", f.Short)
	}
	if in.NVMePath == "" {
		fmt.Fprintln(w, "  (no --nvme-path: the NVMe placements were not considered)")
	}
}

func (r *Result) writeTable(w io.Writer) {
	in, p, measured := r.Inputs, r.Profile, r.Measured
	fmt.Fprintf(w, "strata plan: %s (%s), %s, on %d device(s) of %s, batch %d × %d tokens", in.Model,
		shapeParams(in.Shape), in.Job.Name(), in.Devices, units.FormatBytes(in.HBMBytes), in.Batch, in.Seq)
	if in.Accum > 1 {
		fmt.Fprintf(w, " × %d micro-batches", in.Accum)
	}
	fmt.Fprintf(w, "\nprofile %s (measured %s): copies %.2f GB/s, CPU Adam %.0f M params/s (%d threads)", r.ProfilePath, p.Created,
		p.CopyBytesPerS/1e9, p.AdamParamsPerS/1e6, p.AdamThreads)
	if d, ok := p.Disk(in.NVMePath); ok {
		fmt.Fprintf(w, ", %s read %.2f GB/s write %.2f GB/s mixed %.2f GB/s", d.Path, d.ReadBytesPerS/1e9, d.WriteBytesPerS/1e9, d.MixedBytesPerS/1e9)
	}
	if f := in.Job.coded(); f != "" {
		fmt.Fprintf(w, ", %s decoding %.0f M params/s", f, p.DecodeRate(f)/1e6)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	coded := in.Job.coded() != ""
	head := "rank\tplacement\tpredicted\tbottleneck\tcompute\tadam\tcopies\tstaging\tdisk\tdevice\thost\tnvme"
	if coded {
		head = strings.Replace(head, "\tdisk", "\tdecode\tdisk", 1)
	}
	if len(measured) > 0 {
		head += "\tmeasured\terror"
	}
	fmt.Fprintln(tw, head)
	var short []Prediction
	for _, pr := range r.Predictions {
		if !pr.Fits {
			short = append(short, pr)
			continue
		}
		t := pr.Terms
		decode := ""
		if coded {
			decode = fmt.Sprintf("%.3f\t", t["decode"])
		}
		line := fmt.Sprintf("%d\t%s\t%.3f s\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%s%.3f\t%s\t%s\t%s", pr.Rank, pr.Name, pr.StepSeconds, pr.Bottleneck,
			t["compute"], t["adam"], t["copy"], t["staging"], decode, t["disk"], units.FormatBytes(pr.DeviceBytes), units.FormatBytes(pr.HostBytes), units.FormatBytes(pr.NVMeBytes))
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
		fmt.Fprintf(w, "ranking measured: %s\n", MeasuredRanking(r.Predictions, measured))
		pairs, bad := RankingPairs(r.Predictions, measured)
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

// RankingPairs counts the pairs of measured placements of different
// ranks, and of those the pairs whose measured medians are in the other
// order than their ranks.
func RankingPairs(preds []Prediction, measured map[string]float64) (pairs, bad int) {
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

// MeasuredRanking is the checked placements in the order of their
// measured medians, each with its predicted rank.
func MeasuredRanking(preds []Prediction, measured map[string]float64) string {
	var rs []Prediction
	for _, pr := range preds {
		if _, ok := measured[pr.Name]; ok {
			rs = append(rs, pr)
		}
	}
	slices.SortStableFunc(rs, func(a, b Prediction) int { return cmp.Compare(measured[a.Name], measured[b.Name]) })
	var parts []string
	for _, pr := range rs {
		parts = append(parts, fmt.Sprintf("%s (rank %d, %.3f s)", pr.Name, pr.Rank, measured[pr.Name]))
	}
	return strings.Join(parts, " < ")
}

// JSONResult is a Result as `strata plan --json` writes it.
type JSONResult struct {
	Model   string          `json:"model"`
	Params  int64           `json:"params"`
	Job     Job             `json:"job"`
	Accum   int             `json:"accum"`
	Devices int             `json:"devices"`
	Batch   int             `json:"batch"`
	Seq     int             `json:"seq"`
	Profile string          `json:"profile"`
	Configs []JSONPlacement `json:"configs"`
	// With a check: the pairs of measured placements of different
	// ranks, and how many of them were measured in the other order.
	RankPairs      *int `json:"ranking_pairs,omitempty"`
	RankMismatches *int `json:"ranking_mismatches,omitempty"`
}

// JSONPlacement is one placement's prediction and, when it was checked,
// its measured median step.
type JSONPlacement struct {
	Prediction
	Measured *float64 `json:"measured_step_s,omitempty"`
	Error    *float64 `json:"error,omitempty"` // (predicted − measured) / measured
}

// JSON is r as tagged structs (`strata plan --json`).
func (r *Result) JSON() JSONResult {
	in := r.Inputs
	out := JSONResult{Model: in.Model, Params: in.Shape.ParamCount(), Job: in.Job, Accum: max(in.Accum, 1), Devices: in.Devices, Batch: in.Batch, Seq: in.Seq, Profile: r.ProfilePath}
	if len(r.Measured) > 0 {
		pairs, bad := RankingPairs(r.Predictions, r.Measured)
		out.RankPairs, out.RankMismatches = &pairs, &bad
	}
	for _, pr := range r.Predictions {
		cj := JSONPlacement{Prediction: pr}
		if m, ok := r.Measured[pr.Name]; ok {
			e := (pr.StepSeconds - m) / m
			cj.Measured, cj.Error = &m, &e
		}
		if math.IsNaN(cj.StepSeconds) {
			cj.StepSeconds = 0
		}
		out.Configs = append(out.Configs, cj)
	}
	return out
}

// paramWords is a parameter count as people say it: 124.4M, 6.50B.
// shapeParams is the shape's parameter count in words, with a mixture of
// experts' active ones (TopK experts of each sparse layer).
func shapeParams(s model.Shape) string {
	if s.MoE() {
		return paramWords(s.ParamCount()) + " params, " + paramWords(s.ActiveParamCount()) + " active"
	}
	return paramWords(s.ParamCount()) + " params"
}

func paramWords(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	}
	return estimate.GroupDigits(n)
}
