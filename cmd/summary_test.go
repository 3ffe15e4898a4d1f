package cmd

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/strata-ai/strata/nvme/nvmetest"
)

// snakeKeys lists the keys of v (JSON objects, nested) that are not
// snake_case, with their paths.
func snakeKeys(v any, path string) []string {
	snake := regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)
	var bad []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if !snake.MatchString(k) {
				bad = append(bad, path+"."+k)
			}
			bad = append(bad, snakeKeys(e, path+"."+k)...)
		}
	case []any:
		for i, e := range x {
			bad = append(bad, snakeKeys(e, fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return bad
}

// TestSummaryLinesPerConfiguration: the progress line and the summary
// agree and read true in each configuration: nothing offloaded (no tier
// lines), params and optimizer in host RAM, both on NVMe, the optimizer
// alone on NVMe (the params stay on the devices: no HBM budget of 1 B),
// and a model imported with --init. The progress line's hit rate is the
// summary's, over the whole run; its NVMe reads are the summary's; a
// formula of 0 bytes has no ratio ("-", never 0.0000); /+pad is 1 (the
// tier store's copies on the device are model state); summary.json's keys
// are all snake_case.
func TestSummaryLinesPerConfiguration(t *testing.T) {
	nv := nvmetest.Dir(t)
	hfDir := filepath.Join(t.TempDir(), "model")
	writeHFModel(t, hfDir, initShape, 11)
	const base = `{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
	  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "bf16": {"enabled": true},
	  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0 %s},
	  "strata": {"devices": 2, "seq_len": 32 %s}}`
	for _, c := range []struct {
		name, zero, strata string
		init               bool
		want, not          []string
		moments            string // summary.json's tier.optimizer_state_moments, when given
		master             string // and tier.optimizer_state_master (fp32 when not)
	}{
		{name: "no offload", strata: `, "model": "tiny"`, not: []string{"hits", "peak/budget", "prefetch ("}},
		{name: "host", zero: `, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}`, strata: `, "model": "tiny"`,
			want: []string{"tiers: params in host", ", nvme none\n"}, not: []string{"nvme read"}},
		{name: "nvme", zero: fmt.Sprintf(`, "offload_param": {"device": "nvme", "nvme_path": %q}, "offload_optimizer": {"device": "nvme", "nvme_path": %q}`, nv, nv),
			strata: `, "model": "tiny"`, want: []string{"tiers: params in nvme", "nvme read "}},
		{name: "optimizer on nvme", zero: fmt.Sprintf(`, "offload_optimizer": {"device": "nvme", "nvme_path": %q}`, nv), strata: `, "model": "tiny"`,
			want: []string{"peak/budget: hbm none (params stay on the devices)"}, not: []string{"/1 B"}},
		{name: "imported", zero: `, "offload_optimizer": {"device": "cpu"}`, init: true, want: []string{"initial weights: "}},
		{name: "int8 moments and an fp32 master on nvme", zero: fmt.Sprintf(`, "offload_optimizer": {"device": "nvme", "nvme_path": %q}`, nv),
			strata: `, "model": "small", "optimizer_state": {"moments": "int8", "master": "fp32"}`, want: []string{", int8 moments)"}, moments: "int8"},
		// The master is not written: on NVMe in bf16 it is the remainder
		// (config.MasterFormat).
		{name: "int8 moments and the default master on nvme", zero: fmt.Sprintf(`, "offload_optimizer": {"device": "nvme", "nvme_path": %q}`, nv),
			strata: `, "model": "small", "optimizer_state": {"moments": "int8"}`, want: []string{", int8 moments, bf16+remainder master)"},
			moments: "int8", master: "bf16+remainder"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := writeFile(t, "cfg.json", fmt.Sprintf(base, c.zero, c.strata))
			out := filepath.Join(t.TempDir(), "run")
			args := []string{"train", "--config", cfg, "--steps", "4", "--out", out}
			if c.init {
				args = append(args, "--init", hfDir)
			}
			stdout, stderr, err := runApp(t, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			all := stderr + stdout
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("no %q in:\n%s", w, all)
				}
			}
			for _, w := range append(c.not, "0 B/1 B", " 0.0000 ", "+Inf", "NaN") {
				if strings.Contains(all, w) {
					t.Errorf("%q in:\n%s", w, all)
				}
			}
			row := regexp.MustCompile(`(?m)^cpu:0 .* (\S+) +(\S+) \| `).FindStringSubmatch(stdout)
			if row == nil || row[2] != "1.0000" {
				t.Errorf("device row's /+pad is not 1.0000: %q\n%s", row, stdout)
			}
			if m := regexp.MustCompile(`hits (\d+\.\d)%`).FindStringSubmatch(stderr); m != nil {
				var rate float64
				if s := regexp.MustCompile(`hit rate (\d\.\d+)`).FindStringSubmatch(stdout); s != nil {
					fmt.Sscan(s[1], &rate)
				}
				var hits float64
				fmt.Sscan(m[1], &hits)
				if math.Abs(hits-100*rate) > 0.051 { // both rounded: to 0.1 % and to 4 digits
					t.Errorf("progress line hits %s%%, the summary's hit rate %.4f", m[1], rate)
				}
			}
			if m := regexp.MustCompile(`nvme read (\S+ \S+) written`).FindStringSubmatch(stderr); m != nil && !strings.Contains(stdout, "nvme->host "+m[1]+" ") {
				t.Errorf("progress line nvme read %s, not the summary's:\n%s", m[1], stdout)
			}
			b, err := os.ReadFile(filepath.Join(out, "summary.json"))
			if err != nil {
				t.Fatal(err)
			}
			var js map[string]any
			if err := json.Unmarshal(b, &js); err != nil {
				t.Fatal(err)
			}
			if bad := snakeKeys(js, ""); len(bad) > 0 {
				t.Errorf("summary.json keys not in snake_case: %v", bad)
			}
			if c.moments != "" {
				tier, _ := js["tier"].(map[string]any)
				ob, _ := tier["optimizer_state_bytes"].(map[string]any)
				master := cmp.Or(c.master, "fp32")
				if tier["optimizer_state_moments"] != c.moments || tier["optimizer_state_master"] != master || ob["nvme"] == nil || ob["nvme"].(float64) <= 0 {
					t.Errorf("summary.json tier: moments %v, master %v, optimizer_state_bytes %v", tier["optimizer_state_moments"], tier["optimizer_state_master"], ob)
				}
			}
		})
	}
}

// TestEvalSeqIsRunSeqLen: eval of a Strata run without --seq scores
// windows of the run's seq_len (32 here), not the model's max_seq_len (64),
// which a Hugging Face directory, with no seq_len, gets.
func TestEvalSeqIsRunSeqLen(t *testing.T) {
	cfg := writeFile(t, "cfg.json", fmt.Sprintf(frozenConfig, `, "model": "tiny"`))
	run := filepath.Join(t.TempDir(), "run")
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "1", "--save-every", "1", "--out", run); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	hfDir := filepath.Join(t.TempDir(), "hf")
	if _, stderr, err := runApp(t, "export", "--format", "hf", run, hfDir); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	text := writeFile(t, "text.txt", strings.Repeat("the cat sat on the mat. ", 20))
	for m, want := range map[string]int{run: 32, hfDir: 64} {
		if r, _ := evalJSON(t, "--model", m, "--data", text); r.Seq != want {
			t.Errorf("eval --model %s: seq %d, want %d", m, r.Seq, want)
		}
	}
}

// TestWarmupHeldAtMinNote: WarmupLR with warmup_num_steps 0 holds steps 1
// and 2 at warmup_min_lr (DeepSpeed's max(2, W)), which the progress line
// prints as "lr 0": a note says so at start-up and how to have no warm-up;
// a warm-up of 4 steps gets none.
func TestWarmupHeldAtMinNote(t *testing.T) {
	const cfgText = `{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
	  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "bf16": {"enabled": true},
	  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": %d}},
	  "zero_optimization": {"stage": 1}, "strata": {"model": "tiny", "devices": 1, "seq_len": 16}}`
	for w, want := range map[int]string{0: "step(s) 1, 2 run at warmup_min_lr 0", 4: ""} {
		_, stderr, err := runApp(t, "train", "--config", writeFile(t, "cfg.json", fmt.Sprintf(cfgText, w)), "--steps", "3")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if got := strings.Contains(stderr, "warms up over 2 steps"); got != (want != "") || !strings.Contains(stderr, want) {
			t.Errorf("warmup_num_steps %d: want the note %q:\n%s", w, want, stderr)
		}
		if w == 0 && !strings.Contains(stderr, "step 2: loss") {
			t.Errorf("no progress line of step 2:\n%s", stderr)
		}
	}
}
