package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInitMalformedConfig: a model directory whose config.json does not
// parse says so, with the file's line and column and encoding/json's
// message, not "neither a Hugging Face model directory nor a Strata
// checkpoint"; eval and generate's --model too.
func TestInitMalformedConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte("{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": 16,\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := cfg + ":4:1: invalid JSON: invalid character '}'"
	for _, args := range [][]string{{"train", "--init", dir, "--steps", "1"}, {"generate", "--model", dir, "--prompt", "x"}} {
		_, _, err := runApp(t, args...)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "neither") {
			t.Errorf("%s: %v, want %q", args[0], err, want)
		}
	}
}

// TestStepsOutOfRange: a --steps that does not parse or is not positive
// is one line, not the command's help.
func TestStepsOutOfRange(t *testing.T) {
	for _, v := range []string{"1e30", "-3", "0", "99999999999999999999"} {
		_, errOut, err := runApp(t, "train", "--steps", v)
		if err == nil || strings.Contains(err.Error(), "\n") || strings.Contains(errOut, "USAGE") || strings.Contains(errOut, "OPTIONS") {
			t.Errorf("--steps %s: %v\n%s", v, err, errOut)
		}
	}
}
