package config_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestMonitorKeys: "tensorboard" and "csv_monitor" with DeepSpeed's keys
// and defaults (nil unless enabled), the config printed back reads the
// same, and nothing about them is a notice any more.
func TestMonitorKeys(t *testing.T) {
	parse := func(js string) (*config.Config, error) {
		return config.Parse([]byte(js), "f.json", config.Options{LookupShape: lookup})
	}
	const micro = `"train_micro_batch_size_per_gpu": 1`
	def := &config.Monitor{Enabled: true, JobName: "DeepSpeedJobName"}
	for _, c := range []struct {
		js      string
		tb, csv *config.Monitor
	}{
		{`{` + micro + `}`, nil, nil},
		{`{` + micro + `, "tensorboard": {"enabled": true}}`, def, nil},
		{`{` + micro + `, "csv_monitor": {"enabled": true}}`, nil, def},
		{`{` + micro + `, "tensorboard": {"enabled": false, "output_path": "tb"}, "csv_monitor": {}}`, nil, nil},
		{`{` + micro + `, "tensorboard": {"enabled": true, "output_path": "/logs/tb", "job_name": "run7"}, "csv_monitor": {"enabled": true, "output_path": "csv", "job_name": "a/b"}}`,
			&config.Monitor{Enabled: true, OutputPath: "/logs/tb", JobName: "run7"}, &config.Monitor{Enabled: true, OutputPath: "csv", JobName: "a/b"}},
		{`{` + micro + `, "wandb": {"enabled": false, "project": "p", "team": "t", "group": "g"}, "comet": {"enabled": false, "project": "p"}}`, nil, nil},
		{`{` + micro + `, "csv_monitor": {"enabled": true, "job_name": "run..2"}}`, nil, &config.Monitor{Enabled: true, JobName: "run..2"}},
	} {
		cfg, err := parse(c.js)
		if err != nil {
			t.Fatalf("%s: %v", c.js, err)
		}
		if !sameMonitor(cfg.TensorBoard, c.tb) || !sameMonitor(cfg.CSVMonitor, c.csv) {
			t.Errorf("%s: tensorboard %+v csv_monitor %+v; want %+v %+v", c.js, cfg.TensorBoard, cfg.CSVMonitor, c.tb, c.csv)
		}
		for _, n := range cfg.Ignored() {
			if strings.Contains(n, "tensorboard") || strings.Contains(n, "csv_monitor") || strings.Contains(n, "wandb") || strings.Contains(n, "comet") {
				t.Errorf("%s: notice %q", c.js, n)
			}
		}
		again, err := parse(string(cfg.JSON()))
		if err != nil || !sameMonitor(again.TensorBoard, cfg.TensorBoard) || !sameMonitor(again.CSVMonitor, cfg.CSVMonitor) {
			t.Errorf("%s: printed config reads back as %+v %+v (%v)", c.js, again.TensorBoard, again.CSVMonitor, err)
		}
	}
	// The other blocks Strata has no feature for keep their notice.
	cfg, err := parse(`{` + micro + `, "flops_profiler": {"enabled": true}}`)
	if err != nil || !strings.Contains(strings.Join(cfg.Ignored(), "\n"), "flops_profiler is accepted but not used: Strata has no such feature") {
		t.Errorf("flops_profiler: %v, notices %q", err, cfg.Ignored())
	}
	for _, c := range []struct{ js, want string }{
		{`{` + micro + `, "tensorboard": {"enabled": "yes"}}`, `tensorboard.enabled: want true or false, got string "yes"`},
		{`{` + micro + `, "csv_monitor": {"enabled": true, "output_path": 3}}`, `csv_monitor.output_path: want a string, got number 3`},
		{`{` + micro + `, "csv_monitor": {"enabled": true, "outputpath": "x"}}`, `unknown key "csv_monitor.outputpath"; did you mean "csv_monitor.output_path"?`},
		{`{` + micro + `, "tensorboard": {"enabled": true, "job_name": "/abs"}}`, `tensorboard.job_name: "/abs" is not a directory name inside output_path`},
		{`{` + micro + `, "tensorboard": {"enabled": true, "job_name": "../up"}}`, `tensorboard.job_name: "../up" is not a directory name inside output_path`},
		{`{` + micro + `, "tensorboard": {"enabled": true, "job_name": "a/../.."}}`, `tensorboard.job_name: "a/../.." is not a directory name inside output_path`},
		{`{` + micro + `, "wandb": {"enabled": true, "project": "p"}}`, `wandb.enabled: true is not supported: Strata has no wandb client`},
		{`{` + micro + `, "comet": {"enabled": true}}`, `comet.enabled: true is not supported: Strata has no Comet client`},
		{`{` + micro + `, "wandb": {"enabled": 1}}`, `wandb.enabled: want true or false, got number 1`},
		{`{` + micro + `, "wandb": {"enabled": false, "entity": "x"}}`, `unknown key "wandb.entity"`},
	} {
		_, err := parse(c.js)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.js, err, c.want)
		}
	}
	// The refusal is one line saying why and what to use instead.
	_, err = parse("{" + micro + `,` + "\n" + `"wandb": {"enabled": true}}`)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "f.json:2:") ||
		!strings.Contains(err.Error(), `enable "tensorboard" or "csv_monitor" instead`) || !strings.Contains(err.Error(), "steps.jsonl") {
		t.Errorf("wandb enabled: %q, want one line at f.json:2 naming tensorboard, csv_monitor and steps.jsonl", err)
	}
}

func sameMonitor(a, b *config.Monitor) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// TestMonitorDir: output_path/job_name, a relative output_path (the empty
// default included) inside the run's directory, or the working directory
// without one, as DeepSpeed's os.path.join(output_path, job_name).
func TestMonitorDir(t *testing.T) {
	for _, c := range []struct {
		m         config.Monitor
		run, want string
	}{
		{config.Monitor{JobName: "DeepSpeedJobName"}, "/runs/a", "/runs/a/DeepSpeedJobName"},
		{config.Monitor{JobName: "DeepSpeedJobName"}, "", "DeepSpeedJobName"},
		{config.Monitor{OutputPath: "tb", JobName: "j"}, "/runs/a", "/runs/a/tb/j"},
		{config.Monitor{OutputPath: "tb", JobName: "j"}, "", "tb/j"},
		{config.Monitor{OutputPath: "/logs", JobName: "j"}, "/runs/a", "/logs/j"},
		{config.Monitor{OutputPath: "/logs", JobName: ""}, "rel", "/logs"},
	} {
		if got := c.m.Dir(c.run); got != filepath.FromSlash(c.want) {
			t.Errorf("%+v in %q: %q, want %q", c.m, c.run, got, c.want)
		}
	}
}
