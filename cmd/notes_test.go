package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrainStockConfigQuiet: `strata train` on DeepSpeed's documented
// ZeRO-3 offload config (the Hugging Face integration's, every value
// "auto") said 14 "note:" lines before the first step: 11 keys accepted but
// not used, a line each, and the pinned host memory's max_segments warning
// twice on a run with no NVMe. Now the keys are one line naming them all,
// the pinned memory is not mentioned (locked, no nvme_path), and stderr,
// a buffer and not a terminal, gets a plain line per steps_per_print (and
// at the last step) instead of a progress bar's frames: no '\r', no ESC.
func TestTrainStockConfigQuiet(t *testing.T) {
	cfg := filepath.Join("..", "testdata", "configs", "ds_zero3_offload.json")
	_, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "3")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var notes, unused []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "note: ") {
			notes = append(notes, l)
		}
		if strings.Contains(l, "accepted but not used") {
			unused = append(unused, l)
		}
	}
	if len(unused) != 1 {
		t.Errorf("%d lines of keys accepted but not used, want 1:\n%s", len(unused), strings.Join(unused, "\n"))
	} else {
		for _, k := range []string{"fp16", "wall_clock_breakdown", "zero_optimization.overlap_comm", "zero_optimization.sub_group_size", "zero_optimization.offload_param.pin_memory", "zero_optimization.stage3_gather_16bit_weights_on_model_save"} {
			if !strings.Contains(unused[0], " "+k+",") && !strings.HasSuffix(unused[0], " "+k) {
				t.Errorf("the line of unused keys does not name %s: %s", k, unused[0])
			}
		}
	}
	if len(notes) != 2 || !strings.HasPrefix(notes[1], `note: "auto" values filled in`) {
		t.Errorf("%d notes, want 2 (the unused keys, the \"auto\" values):\n%s", len(notes), strings.Join(notes, "\n"))
	}
	if strings.Contains(stderr, "max_segments") || strings.Contains(stderr, "pinned host memory") {
		t.Errorf("a run without NVMe warns of the pinned memory's pages:\n%s", stderr)
	}
	if i := strings.IndexAny(stderr, "\r\x1b"); i >= 0 {
		t.Errorf("stderr (a buffer, not a terminal) holds progress frames: %q", stderr[max(0, i-40):min(len(stderr), i+40)])
	}
	if !strings.Contains(stderr, "\nstep 3: loss ") {
		t.Errorf("no plain line for the last step:\n%s", stderr)
	}
}

// TestConfigNotes: one key accepted but not used keeps its line and reason;
// several become one line; other notes pass as they are.
func TestConfigNotes(t *testing.T) {
	one := []string{"fp16 is accepted but not used: no loss scaling", "bf16 is not set: Strata trains in bf16"}
	if got := configNotes(one); len(got) != 2 || got[0] != one[0] || got[1] != one[1] {
		t.Errorf("configNotes(%q) = %q", one, got)
	}
	two := append([]string{"wall_clock_breakdown is accepted but not used: every run reports"}, one...)
	got := configNotes(two)
	if len(got) != 2 || got[0] != "accepted but not used (Strata does without them: config/README.md): wall_clock_breakdown, fp16" || got[1] != one[1] {
		t.Errorf("configNotes(%q) = %q", two, got)
	}
}

// TestIsTerminal: a pipe, a regular file and a buffer are no terminal.
func TestIsTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(w) || isTerminal(f) || isTerminal(&strings.Builder{}) {
		t.Errorf("isTerminal: pipe %v, file %v, buffer %v", isTerminal(w), isTerminal(f), isTerminal(&strings.Builder{}))
	}
}
