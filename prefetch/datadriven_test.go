package prefetch

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt")

// A test file is a list of blocks, pebble's datadriven style:
//
//	# comments
//	command arg=value ...
//	input lines
//	----
//	expected output
//	(blank line)
//
// Commands:
//
//	options          input: budget hbm=N host=N nvme=N | bw nvme-host=N/ms ... | slack D | window N | writebehind on|off
//	shards           input: c0.param 100 home=host [cached=hbm,host]   (c0.r1.param for rank 1)
//	trace [name=X]   input: fwd c0.param hbm read 10ms
//	plan [trace=X] [steps=N]
//	simulate [known=X] run=X,Y,...   (known absent: the first step is recorded)
type block struct {
	comments []string
	cmd      string
	input    []string
	output   string
}

func parseBlocks(t *testing.T, path string) []block {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out []block
	var b block
	i := 0
	for i < len(lines) {
		l := lines[i]
		switch {
		case b.cmd == "" && (strings.HasPrefix(l, "#") || strings.TrimSpace(l) == ""):
			if strings.HasPrefix(l, "#") {
				b.comments = append(b.comments, l)
			}
			i++
		case b.cmd == "":
			b.cmd = l
			i++
			for i < len(lines) && lines[i] != "----" {
				if strings.TrimSpace(lines[i]) == "" {
					t.Fatalf("%s:%d: blank line before ----", path, i+1)
				}
				b.input = append(b.input, lines[i])
				i++
			}
			if i == len(lines) {
				t.Fatalf("%s: block %q has no ----", path, b.cmd)
			}
			i++
			var o []string
			for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
				o = append(o, lines[i])
				i++
			}
			b.output = strings.Join(o, "\n")
			out = append(out, b)
			b = block{}
		}
	}
	return out
}

func writeBlocks(path string, bs []block) error {
	var w strings.Builder
	for i, b := range bs {
		if i > 0 {
			w.WriteString("\n")
		}
		for _, c := range b.comments {
			w.WriteString(c + "\n")
		}
		w.WriteString(b.cmd + "\n")
		for _, l := range b.input {
			w.WriteString(l + "\n")
		}
		w.WriteString("----\n")
		if b.output != "" {
			w.WriteString(b.output + "\n")
		}
	}
	return os.WriteFile(path, []byte(w.String()), 0o644)
}

type ddState struct {
	opts   Options
	res    Residency
	traces map[string]Trace
}

func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			bs := parseBlocks(t, path)
			st := &ddState{opts: DefaultOptions(), res: Residency{}, traces: map[string]Trace{}}
			for i := range bs {
				got := strings.TrimRight(st.run(bs[i]), "\n")
				if *rewrite {
					bs[i].output = got
					continue
				}
				if got != bs[i].output {
					t.Errorf("%s: %s\n--- want\n%s\n--- got\n%s", path, bs[i].cmd, bs[i].output, got)
				}
			}
			if *rewrite {
				if err := writeBlocks(path, bs); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func args(cmd string) (string, map[string]string) {
	f := strings.Fields(cmd)
	m := map[string]string{}
	for _, a := range f[1:] {
		k, v, _ := strings.Cut(a, "=")
		m[k] = v
	}
	return f[0], m
}

func (st *ddState) run(b block) string {
	name, a := args(b.cmd)
	out, err := st.exec(name, a, b.input)
	if err != nil {
		return "error: " + err.Error()
	}
	return out
}

func (st *ddState) exec(name string, a map[string]string, input []string) (string, error) {
	switch name {
	case "options":
		return st.options(input)
	case "shards":
		return st.shards(input)
	case "trace":
		return st.trace(a, input)
	case "plan":
		return st.plan(a)
	case "simulate":
		return st.simulate(a)
	}
	return "", fmt.Errorf("unknown command %q", name)
}

// options sets the planner options (budget, bw, slack, writebehind, eager,
// waitvictim, window).
func (st *ddState) options(input []string) (string, error) {
	for _, l := range input {
		cmd, kv := args(l)
		switch cmd {
		case "budget":
			for k, v := range kv {
				t, err := shard.ParseTier(k)
				if err != nil {
					return "", err
				}
				n, err := units.ParseBytes(v)
				if err != nil {
					return "", err
				}
				st.opts.BudgetBytes[t] = n
			}
		case "bw":
			for k, v := range kv {
				l, err := parseLink(k)
				if err != nil {
					return "", err
				}
				bw, err := parseRate(v)
				if err != nil {
					return "", err
				}
				st.opts.BandwidthBytesPerSec[l] = bw
			}
		case "slack":
			d, err := time.ParseDuration(strings.Fields(l)[1])
			if err != nil {
				return "", err
			}
			st.opts.Slack = d
		case "writebehind", "eager", "waitvictim":
			on, err := onOff(l)
			if err != nil {
				return "", err
			}
			switch cmd {
			case "writebehind":
				st.opts.DisableWriteBehind = !on
			case "eager":
				st.opts.DisableEager = !on
			case "waitvictim":
				st.opts.WaitForVictim = on
			}
		case "window":
			n, err := strconv.Atoi(strings.Fields(l)[1])
			if err != nil {
				return "", err
			}
			st.opts.Window = n
		default:
			return "", fmt.Errorf("unknown option %q", cmd)
		}
	}
	return "ok", st.opts.Validate()
}

// onOff parses an option line "name on" or "name off".
func onOff(l string) (bool, error) {
	switch f := strings.Fields(l); {
	case len(f) == 2 && f[1] == "on":
		return true, nil
	case len(f) == 2 && f[1] == "off":
		return false, nil
	default:
		return false, fmt.Errorf("%s on|off, not %q", f[0], l)
	}
}

// shards adds shards to the residency.
func (st *ddState) shards(input []string) (string, error) {
	for _, l := range input {
		f := strings.Fields(l)
		if len(f) < 3 {
			return "", fmt.Errorf("shard line %q: want key size home=tier", l)
		}
		k, err := parseKey(f[0])
		if err != nil {
			return "", err
		}
		n, err := units.ParseBytes(f[1])
		if err != nil {
			return "", err
		}
		pl := Placement{SizeBytes: n}
		for _, kv := range f[2:] {
			key, v, _ := strings.Cut(kv, "=")
			switch key {
			case "home":
				if pl.Home, err = shard.ParseTier(v); err != nil {
					return "", err
				}
			case "cached":
				for _, tn := range strings.Split(v, ",") {
					tt, err := shard.ParseTier(tn)
					if err != nil {
						return "", err
					}
					pl.Cached |= Tiers(tt)
				}
			default:
				return "", fmt.Errorf("shard line %q: unknown %q", l, key)
			}
		}
		st.res[k] = pl
	}
	return fmt.Sprintf("%d shards", len(st.res)), nil
}

// trace parses a named trace (main by default).
func (st *ddState) trace(a map[string]string, input []string) (string, error) {
	var tr Trace
	for _, l := range input {
		f := strings.Fields(l)
		if len(f) != 5 {
			return "", fmt.Errorf("trace line %q: want phase key tier kind compute", l)
		}
		var ac shard.Access
		var err error
		if ac.Phase, err = parsePhase(f[0]); err != nil {
			return "", err
		}
		if ac.Key, err = parseKey(f[1]); err != nil {
			return "", err
		}
		if ac.Tier, err = shard.ParseTier(f[2]); err != nil {
			return "", err
		}
		if ac.Kind, err = parseKind(f[3]); err != nil {
			return "", err
		}
		if ac.Compute, err = time.ParseDuration(f[4]); err != nil {
			return "", err
		}
		pl, ok := st.res[ac.Key]
		if !ok {
			return "", fmt.Errorf("trace line %q: no shard %s", l, f[1])
		}
		ac.SizeBytes = pl.SizeBytes
		tr.Accesses = append(tr.Accesses, ac)
	}
	if err := tr.Validate(); err != nil {
		return "", err
	}
	n := a["name"]
	if n == "" {
		n = "main"
	}
	st.traces[n] = tr
	return fmt.Sprintf("%d accesses, compute %v", len(tr.Accesses), tr.Compute()), nil
}

// plan runs Plan on a trace.
func (st *ddState) plan(a map[string]string) (string, error) {
	n := a["trace"]
	if n == "" {
		n = "main"
	}
	tr, ok := st.traces[n]
	if !ok {
		return "", fmt.Errorf("no trace %q", n)
	}
	steps := 1
	if v, ok := a["steps"]; ok {
		var err error
		if steps, err = strconv.Atoi(v); err != nil {
			return "", err
		}
	}
	s, err := Plan(tr, st.res, st.opts, steps)
	if err != nil {
		return "", err
	}
	return s.String(), nil
}

// simulate runs Simulate on a list of traces.
func (st *ddState) simulate(a map[string]string) (string, error) {
	var known Trace
	if n, ok := a["known"]; ok {
		if known, ok = st.traces[n]; !ok {
			return "", fmt.Errorf("no trace %q", n)
		}
	}
	var steps []Trace
	for _, n := range strings.Split(a["run"], ",") {
		tr, ok := st.traces[n]
		if !ok {
			return "", fmt.Errorf("no trace %q", n)
		}
		steps = append(steps, tr)
	}
	s, err := Simulate(known, steps, st.res, st.opts)
	if err != nil {
		return "", err
	}
	return s.String(), nil
}

func parseLink(s string) (shard.Link, error) {
	for l := shard.Link(0); int(l) < shard.LinkCount; l++ {
		if strings.ReplaceAll(l.String(), ">", "") == s || l.String() == s {
			return l, nil
		}
	}
	return 0, fmt.Errorf("unknown link %q (nvme-host, host-hbm, hbm-host, host-nvme)", s)
}

// parseRate reads "100/ms": bytes per unit of time.
func parseRate(s string) (float64, error) {
	n, per, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("rate %q: want bytes/unit, e.g. 100/ms", s)
	}
	b, err := units.ParseBytes(n)
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration("1" + per)
	if err != nil {
		return 0, err
	}
	return float64(b) / d.Seconds(), nil
}

func parseKey(s string) (shard.Key, error) {
	f := strings.Split(s, ".")
	var k shard.Key
	if len(f) < 2 || !strings.HasPrefix(f[0], "c") {
		return k, fmt.Errorf("key %q: want c<chunk>[.r<rank>].<state>", s)
	}
	c, err := strconv.Atoi(f[0][1:])
	if err != nil {
		return k, fmt.Errorf("key %q: %w", s, err)
	}
	k.Chunk = shard.ChunkID(c)
	if len(f) == 3 {
		r, err := strconv.Atoi(strings.TrimPrefix(f[1], "r"))
		if err != nil {
			return k, fmt.Errorf("key %q: %w", s, err)
		}
		k.Rank = int32(r)
	}
	st := f[len(f)-1]
	for i := 0; i < shard.StateCount; i++ {
		if shard.State(i).String() == st {
			k.State = shard.State(i)
			return k, nil
		}
	}
	return k, fmt.Errorf("key %q: unknown state %q", s, st)
}

func parsePhase(s string) (shard.Phase, error) {
	for p := shard.Forward; p <= shard.Optimizer; p++ {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown phase %q (fwd, bwd, opt)", s)
}

func parseKind(s string) (shard.Kind, error) {
	for k := shard.Read; k <= shard.Write; k++ {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown kind %q (read, update, write)", s)
}
