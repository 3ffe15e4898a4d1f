package config

import "testing"

func TestEditDistance(t *testing.T) {
	cases := []struct {
		a, b string
		d    int
	}{
		{"", "", 0}, {"stage", "stage", 0}, {"stag", "stage", 1}, {"Stage", "stage", 0},
		{"devise", "device", 1}, {"kitten", "sitting", 3}, {"", "abc", 3}, {"überlap", "overlap", 2},
	}
	for _, tc := range cases {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
		if got := editDistance(tc.b, tc.a); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d (not symmetric)", tc.b, tc.a, got, tc.d)
		}
	}
}

func TestNearest(t *testing.T) {
	keys := []string{"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping", "steps_per_print"}
	cases := map[string]string{
		"train_micro_batch_size_per_gp":  "train_micro_batch_size_per_gpu",
		"train_micro_batch_size":         "train_micro_batch_size_per_gpu", // truncated, though 6 edits from train_batch_size
		"train_micro":                    "train_micro_batch_size_per_gpu",
		"learning_rate":                  "", // too far from everything
		"gradient_acumulation_steps":     "gradient_accumulation_steps",
		"gradient_clip":                  "gradient_clipping", // 4 edits on a 13-letter key
		"TRAIN_BATCH_SIZE":               "train_batch_size",
		"steps_per_prnt":                 "steps_per_print",
		"xyz":                            "",
		"gradient_accumulation_steps_xx": "gradient_accumulation_steps",
	}
	for in, want := range cases {
		if got := Nearest(in, keys); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", in, got, want)
		}
	}
}
