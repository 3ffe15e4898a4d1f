package cmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/plan"
)

// `strata plan` on the tiny model: it measures what its profile lacks and
// keeps it, ranks every placement that fits (fastest first, each with its
// terms and memory), runs the top two (--check) and reports their
// measured medians; --write-config writes a config that trains; a second
// run reuses the profile; a profile of other hardware, an unknown model, an
// NVMe path that is not a writable directory and a model that fits nowhere
// are one error each, naming it.
func TestPlan(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "profile.json")
	cfgOut := filepath.Join(dir, "best.json")
	args := []string{"plan", "--model", "tiny", "--batch", "1", "--seq", "32", "--profile", prof}
	out, stderr, err := runApp(t, append(args, "--check", "--check-top", "2", "--json", "--write-config", cfgOut)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var res struct {
		Configs []struct {
			Name      string             `json:"name"`
			Fits      bool               `json:"fits"`
			Predicted float64            `json:"predicted_step_s"`
			Measured  *float64           `json:"measured_step_s"`
			Terms     map[string]float64 `json:"terms_s"`
			Device    int64              `json:"device_bytes"`
			Rank      int                `json:"rank"`
			Ckpt      bool               `json:"activation_checkpointing"`
		} `json:"configs"`
		RankPairs *int `json:"ranking_pairs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(res.Configs) != 20 {
		t.Fatalf("%d placements, want 20 (no --nvme-path; the 2 at stage 3 in host RAM with narrow state too; each again with activation checkpointing): %s", len(res.Configs), out)
	}
	narrow, ckpt := 0, 0
	for _, c := range res.Configs {
		if strings.Contains(c.Name, "int8 moments, bf16+remainder master") {
			narrow++
		}
		if c.Ckpt != strings.HasSuffix(c.Name, ", activation checkpointing") {
			t.Errorf("%s: activation_checkpointing %v", c.Name, c.Ckpt)
		}
		if c.Ckpt {
			ckpt++
		}
	}
	if narrow != 4 || ckpt != 10 {
		t.Errorf("%d placements with narrow optimizer state, %d checkpointed; want 4 and 10", narrow, ckpt)
	}
	if res.RankPairs == nil {
		t.Error("--check --json: no ranking_pairs")
	}
	for i, c := range res.Configs {
		if !c.Fits || !(c.Predicted > 0) || !(c.Terms["compute"] > 0) || c.Device <= 0 || c.Rank < 1 || i > 0 && c.Rank < res.Configs[i-1].Rank {
			t.Errorf("placement %d %s: %+v", i, c.Name, c)
		}
		if i > 0 && c.Predicted < res.Configs[i-1].Predicted {
			t.Errorf("not fastest first at %s", c.Name)
		}
		if (c.Measured != nil) != (i < 2) || c.Measured != nil && !(*c.Measured > 0) {
			t.Errorf("placement %d %s: measured %v (--check-top 2)", i, c.Name, c.Measured)
		}
	}
	p, err := plan.Load(prof)
	if err != nil || p.AdamParamsPerS <= 0 || p.CopyBytesPerS <= 0 || len(p.Computes) != 1 {
		t.Fatalf("profile %+v, %v", p, err)
	}
	// The config --write-config wrote trains, and with the profile where
	// strata train looks (the user's config directory) the run prints
	// and records the prediction beside its median step.
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "xdg"))
	if err := p.Save(filepath.Join(dir, "xdg", "strata", "profile.json")); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	out, stderr, err = runApp(t, "train", "--config", cfgOut, "--steps", "4", "--out", run, "--no-progress")
	if err != nil {
		t.Fatalf("--write-config's config does not train: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, "step time: median ") || !strings.Contains(out, "strata plan predicted") {
		t.Errorf("no prediction beside the measured step:\n%s", out)
	}
	var sum struct {
		Measured  float64 `json:"measured_step_s"`
		Predicted float64 `json:"predicted_step_s"`
	}
	b, err := os.ReadFile(filepath.Join(run, "summary.json"))
	if err != nil || json.Unmarshal(b, &sum) != nil || !(sum.Measured > 0) || !(sum.Predicted > 0) {
		t.Errorf("summary.json measured %v predicted %v (%v)", sum.Measured, sum.Predicted, err)
	}
	// Again: nothing measured, a table.
	out, stderr, err = runApp(t, args...)
	if err != nil || strings.Contains(stderr, "measuring") || !strings.Contains(out, "stage 0, resident") || !strings.Contains(out, "bottleneck") {
		t.Fatalf("second run: %v\n%s\n%s", err, out, stderr)
	}

	p.Machine.CPU = "another CPU"
	if err := p.Save(prof); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{args, "measured on another machine (another CPU"},
		{[]string{"plan", "--model", "gpt-9"}, `--model "gpt-9" is neither a named shape`},
		{[]string{"plan", "--model", "tiny", "--nvme-path", filepath.Join(dir, "absent")}, "absent is not a directory"},
		{[]string{"plan", "--model", "gpt-7b", "--hbm", "1GiB"}, "gpt-7b does not fit this machine in any placement"},
	} {
		if _, _, err := runApp(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
	}
	ro := filepath.Join(dir, "ro")
	if err := os.Mkdir(ro, 0o500); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 { // root writes anywhere
		if _, _, err := runApp(t, "plan", "--model", "tiny", "--nvme-path", ro); err == nil || !strings.Contains(err.Error(), "is not writable") {
			t.Errorf("read-only --nvme-path: %v", err)
		}
	}
}

// TestRankingPairs: only placements of different ranks are compared; a
// pair measured in the other order than its ranks is a mismatch, ties'
// order is not.
func TestRankingPairs(t *testing.T) {
	preds := []plan.Prediction{
		{Config: plan.Config{Name: "a"}, Fits: true, Rank: 1},
		{Config: plan.Config{Name: "b"}, Fits: true, Rank: 1},
		{Config: plan.Config{Name: "c"}, Fits: true, Rank: 2},
		{Config: plan.Config{Name: "d"}, Fits: true, Rank: 3},
	}
	for _, c := range []struct {
		measured   map[string]float64
		pairs, bad int
	}{
		{map[string]float64{"a": 1, "c": 2, "d": 3}, 3, 0},
		{map[string]float64{"a": 1.1, "b": 1.0, "c": 2, "d": 3}, 5, 0}, // a and b tie: their order is not checked
		{map[string]float64{"a": 1, "c": 3, "d": 2}, 3, 1},
		{map[string]float64{"a": 4, "c": 3, "d": 2}, 3, 3},
		{map[string]float64{"a": 1, "b": 2}, 0, 0},
	} {
		if p, b := plan.RankingPairs(preds, c.measured); p != c.pairs || b != c.bad {
			t.Errorf("%v: %d pairs, %d mismatched; want %d, %d", c.measured, p, b, c.pairs, c.bad)
		}
	}
}

// `strata plan` with a profile of this machine holding 1e308 GB/s (or a
// negative time) refuses it in one line naming the file and the key and
// saying how to measure again, instead of ranking placements by it.
func TestPlanAbsurdProfile(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "profile.json")
	for _, c := range []struct {
		edit func(p *plan.Profile)
		key  string
	}{
		{func(p *plan.Profile) { p.CopyBytesPerS = 1e308 }, "copy_bytes_per_s 1e+308"},
		{func(p *plan.Profile) { p.Computes[0].FwdBwdSeconds = -0.5 }, "computes[0].fwd_bwd_s -0.5"},
	} {
		p := plan.NewProfile(plan.ThisMachine("cpu", "cpu:0"))
		p.CopyBytesPerS, p.AdamParamsPerS, p.AdamThreads = 10e9, 1e9, 2
		p.SetAdamRate(plan.AdamState{Moments: plan.NarrowMoments, Master: plan.NarrowMaster, ParamsPerS: 0.5e9})
		p.SetCompute(plan.Compute{Model: "tiny", Devices: 1, Batch: 1, Seq: 32, FwdBwdSeconds: 0.01, DeviceAdamSeconds: 0.001, CheckpointFwdBwdSeconds: 0.012})
		c.edit(p)
		b, _ := json.Marshal(p)
		if err := os.WriteFile(prof, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out, stderr, err := runApp(t, "plan", "--model", "tiny", "--batch", "1", "--seq", "32", "--profile", prof)
		var line bytes.Buffer
		code := printError("plan", err, &line)
		want := "strata plan: profile " + prof + ": " + c.key + " is not a measured figure"
		if code != 1 || !strings.HasPrefix(line.String(), want) || !strings.Contains(line.String(), "strata plan --probe") || strings.Count(line.String(), "\n") != 1 {
			t.Errorf("exit %d %q, want 1 and %q\nstdout %.2000s\nstderr %s", code, line.String(), want, out, stderr)
		}
	}
}

// TestTrainProfile: strata train finds the profile wherever strata plan
// wrote it: $STRATA_PROFILE (plan writes there and train reads there),
// --profile FILE (over $STRATA_PROFILE), and prints the prediction beside
// its median step, summary.json recording both and the error. Without a
// prediction it prints one line naming where it looked and why (no
// profile there, one of another machine, one that does not decode, one
// without this batch's step) and summary.json records that line; a run of
// fewer than 3 steps (no median past the warm-up) says nothing.
func TestTrainProfile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "xdg")) // nothing there
	envProf := filepath.Join(dir, "env", "profile.json")
	t.Setenv(plan.ProfileEnv, envProf)
	cfg := filepath.Join(dir, "tiny.json")
	if _, stderr, err := runApp(t, "plan", "--model", "tiny", "--batch", "1", "--seq", "32", "--write-config", cfg); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	p, err := plan.Load(envProf)
	if err != nil {
		t.Fatalf("strata plan with %s set: %v", plan.ProfileEnv, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "xdg", "strata", "profile.json")); err == nil {
		t.Errorf("strata plan with %s set wrote the default profile too", plan.ProfileEnv)
	}
	type summary struct {
		Measured  float64  `json:"measured_step_s"`
		Predicted float64  `json:"predicted_step_s"`
		By        string   `json:"predicted_by"`
		Error     *float64 `json:"step_time_error"`
		Note      string   `json:"prediction_note"`
	}
	n := 0
	train := func(steps string, args ...string) (stepLine string, sum summary) {
		t.Helper()
		n++
		run := filepath.Join(dir, fmt.Sprint("run", n))
		out, stderr, err := runApp(t, append([]string{"train", "--config", cfg, "--steps", steps, "--out", run, "--no-progress"}, args...)...)
		if err != nil {
			t.Fatalf("train %v: %v\n%s", args, err, stderr)
		}
		for line := range strings.Lines(out) {
			if strings.HasPrefix(line, "step time: ") {
				if stepLine != "" {
					t.Errorf("train %v: two step time lines:\n%s", args, out)
				}
				stepLine = strings.TrimSuffix(line, "\n")
			}
		}
		b, err := os.ReadFile(filepath.Join(run, "summary.json"))
		if err != nil || json.Unmarshal(b, &sum) != nil {
			t.Fatalf("train %v: summary.json %v\n%s", args, err, b)
		}
		return stepLine, sum
	}
	predicted := func(what, profile string, args ...string) {
		t.Helper()
		line, sum := train("4", args...)
		want := "strata plan predicted "
		if !strings.HasPrefix(line, "step time: median ") || !strings.Contains(line, want) || !strings.HasSuffix(line, "%, profile "+profile+")") {
			t.Errorf("%s: step time line %q, want the prediction of %s", what, line, profile)
		}
		if !(sum.Measured > 0) || !(sum.Predicted > 0) || sum.By != "strata plan, profile "+profile || sum.Error == nil || sum.Note != "" ||
			math.Abs(*sum.Error-(sum.Predicted/sum.Measured-1)) > 1e-9 {
			t.Errorf("%s: summary.json %+v (error %v)", what, sum, sum.Error)
		}
	}
	predicted(plan.ProfileEnv, envProf)
	flagProf := filepath.Join(dir, "flag.json")
	if err := p.Save(flagProf); err != nil {
		t.Fatal(err)
	}
	t.Setenv(plan.ProfileEnv, filepath.Join(dir, "absent.json"))
	predicted("--profile over "+plan.ProfileEnv, flagProf, "--profile", flagProf)

	other, bad, batch2 := filepath.Join(dir, "other.json"), filepath.Join(dir, "bad.json"), filepath.Join(dir, "batch2.json")
	q := *p
	q.Machine.CPU = "another CPU"
	if err := q.Save(other); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"version": 1,`), 0o644); err != nil {
		t.Fatal(err)
	}
	q = *p
	q.Computes = append([]plan.Compute(nil), p.Computes...)
	q.Computes[0].Batch = 2
	if err := q.Save(batch2); err != nil {
		t.Fatal(err)
	}
	xdg := filepath.Join(dir, "xdg", "strata", "profile.json")
	for _, c := range []struct {
		env  string
		args []string
		want string
	}{
		{"", nil, "no profile at " + xdg + " (the default; --profile FILE or STRATA_PROFILE name another; strata plan --model tiny writes one)"},
		{filepath.Join(dir, "absent.json"), nil, "no profile at " + filepath.Join(dir, "absent.json") + " (STRATA_PROFILE; strata plan --model tiny writes one there)"},
		{"", []string{"--profile", filepath.Join(dir, "absent.json")}, "no profile at " + filepath.Join(dir, "absent.json") + " (--profile; strata plan --model tiny --profile " + filepath.Join(dir, "absent.json") + " writes one)"},
		{"", []string{"--profile", other}, "the profile " + other + " was measured on another machine (another CPU"},
		{"", []string{"--profile", bad}, "profile " + bad + ": unexpected end of JSON input"},
		{envProf, []string{"--profile", batch2}, "the profile " + batch2 + " has no step of tiny on 1 device(s) at batch 1 × 32 tokens (strata plan --model tiny --batch 1 --seq 32 --profile " + batch2 + " measures it)"},
	} {
		t.Setenv(plan.ProfileEnv, c.env)
		line, sum := train("4", c.args...)
		_, note, _ := strings.Cut(line, "; no prediction: ")
		if !strings.HasPrefix(line, "step time: median ") || !strings.HasPrefix(note, c.want) {
			t.Errorf("%s=%q %v: step time line %q, want one ending in no prediction: %s", plan.ProfileEnv, c.env, c.args, line, c.want)
		}
		if !(sum.Measured > 0) || sum.Predicted != 0 || sum.By != "" || sum.Error != nil || sum.Note != note {
			t.Errorf("%s=%q %v: summary.json %+v, want the measured step and the note %q", plan.ProfileEnv, c.env, c.args, sum, note)
		}
	}
	t.Setenv(plan.ProfileEnv, "")
	if line, sum := train("2"); line != "" || sum.Note != "" {
		t.Errorf("2 steps: %q, note %q; want nothing (no median past the warm-up)", line, sum.Note)
	}

	// A LoRA job: its own step, measured by strata plan --job lora; the
	// written config carries strata.lora, and train predicts from it.
	t.Setenv(plan.ProfileEnv, envProf)
	full := cfg
	cfg = filepath.Join(dir, "lora.json")
	js, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	loraJS := strings.Replace(string(js), `"strata": {`, `"strata": {"lora": {"r": 4, "alpha": 8, "target_modules": ["all-linear"]}, `, 1)
	if err := os.WriteFile(cfg, []byte(loraJS), 0o644); err != nil {
		t.Fatal(err)
	}
	line, _ := train("4")
	if want := "has no step of tiny (LoRA r 4 on all-linear) on 1 device(s) at batch 1 × 32 tokens (strata plan --model tiny --batch 1 --seq 32 --job lora --lora r=4,alpha=8,targets=all-linear"; !strings.Contains(line, want) {
		t.Errorf("LoRA run, the profile with the full fine-tune's step only: %q, want %q", line, want)
	}
	if _, stderr, err := runApp(t, "plan", "--model", "tiny", "--batch", "1", "--seq", "32", "--job", "lora", "--lora", "r=4,alpha=8,targets=all-linear", "--write-config", cfg); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	written, err := os.ReadFile(cfg)
	if err != nil || !strings.Contains(string(written), `"lora": {"r": 4, "alpha": 8, "target_modules": ["all-linear"], "base_dtype": "bf16"}`) {
		t.Fatalf("plan --job lora --write-config: %v\n%s", err, written)
	}
	predicted("LoRA", envProf)
}
