package config

import (
	"path/filepath"
	"slices"
	"strings"
)

// Monitor is DeepSpeed's "tensorboard" or "csv_monitor" block
// (deepspeed/monitor/config.py): the run's scalars written under
// output_path/job_name by process 0.
type Monitor struct {
	Enabled bool `json:"enabled"`
	// OutputPath is the directory the job's directory goes in: DeepSpeed's
	// "" is the directory the run was started from (os.path.join("",
	// job_name)); Strata resolves "" and any relative path against the
	// run's --out, when there is one (Dir).
	OutputPath string `json:"output_path"`
	// JobName is the directory inside OutputPath (default
	// "DeepSpeedJobName", as DeepSpeed).
	JobName string `json:"job_name"`
}

// DefaultJobName is DeepSpeed's job_name of both monitors.
const DefaultJobName = "DeepSpeedJobName"

// Dir is the directory the monitor writes to: output_path/job_name, a
// relative output_path (the empty default included) taken from runDir
// (the run's --out; "" for the working directory, as DeepSpeed).
func (m *Monitor) Dir(runDir string) string {
	out := m.OutputPath
	if !filepath.IsAbs(out) {
		out = filepath.Join(runDir, out)
	}
	return filepath.Join(out, m.JobName)
}

// monitorUnsupported are DeepSpeed's monitors that send the scalars to a
// service, with their keys (read, so that a disabled block passes) and
// why they are refused when enabled.
var monitorUnsupported = []struct {
	key, why string
	keys     []string
}{
	{"wandb", "Strata has no wandb client (wandb sends to a service, and the machines Strata targets often have no network)",
		[]string{"group", "team", "project"}},
	{"comet", "Strata has no Comet client (Comet sends to a service, and the machines Strata targets often have no network)",
		[]string{"samples_log_interval", "project", "workspace", "api_key", "experiment_name", "experiment_key", "online", "mode"}},
}

// decodeMonitors reads "tensorboard" and "csv_monitor" (nil unless
// enabled) and refuses an enabled "wandb" or "comet".
func (c *Config) decodeMonitors(r *section) {
	c.TensorBoard = decodeMonitor(r.sub("tensorboard"))
	c.CSVMonitor = decodeMonitor(r.sub("csv_monitor"))
	for _, u := range monitorUnsupported {
		s := r.sub(u.key)
		for _, k := range u.keys {
			s.get(k) // DeepSpeed's keys, not used: the block is off
		}
		n := s.get("enabled")
		if n == nil || n.kind != kindBool {
			var on bool
			s.boolKey("enabled", &on) // the type's error, if any
			continue
		}
		if n.b {
			s.d.errAt(n.offset, join(s.path, "enabled"), "true is not supported: %s; enable \"tensorboard\" or \"csv_monitor\" instead, or read --out's steps.jsonl", u.why)
		}
	}
}

func decodeMonitor(s *section) *Monitor {
	m := &Monitor{JobName: DefaultJobName}
	s.boolKey("enabled", &m.Enabled)
	s.stringKey("output_path", &m.OutputPath)
	s.stringKey("job_name", &m.JobName)
	if filepath.IsAbs(m.JobName) || slices.Contains(strings.Split(filepath.ToSlash(m.JobName), "/"), "..") {
		s.d.errPath(join(s.path, "job_name"), "%q is not a directory name inside output_path (an absolute path or \"..\" goes outside it): write the directory as output_path", m.JobName)
	}
	if !m.Enabled {
		return nil
	}
	return m
}
