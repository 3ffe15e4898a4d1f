package hf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHFConfigTypes: a key of the wrong JSON type (a number written as a
// string, null where transformers needs a value) is refused naming the key
// and what it wants, never read as the number or the default; null stays
// accepted where transformers gives None a meaning (n_inner, head_dim,
// num_key_value_heads, sliding_window, rope_scaling, torch_dtype).
func TestHFConfigTypes(t *testing.T) {
	null := json.RawMessage("null") // a fixture's nil extra removes the key
	for _, tc := range []struct {
		f     fixture
		extra map[string]any
		want  string
	}{
		{llamaFixture, map[string]any{"hidden_size": "16"}, `"hidden_size": "16" is a JSON string: want a positive whole number`},
		{llamaFixture, map[string]any{"rms_norm_eps": null}, `"rms_norm_eps": null: want a positive number`},
		{llamaFixture, map[string]any{"rms_norm_eps": "1e-6"}, `"rms_norm_eps": "1e-6" is a JSON string: want a positive number`},
		{llamaFixture, map[string]any{"rope_theta": null}, `"rope_theta": null: want a positive number`},
		{llamaFixture, map[string]any{"hidden_size": null}, `"hidden_size": null: want a positive whole number`},
		{llamaFixture, map[string]any{"hidden_size": nil}, `"hidden_size": missing`},
		{llamaFixture, map[string]any{"tie_word_embeddings": null}, `"tie_word_embeddings": null: want true or false`},
		{llamaFixture, map[string]any{"tie_word_embeddings": "false"}, `"tie_word_embeddings": "false" is a JSON string: want true or false`},
		{llamaFixture, map[string]any{"hidden_act": null}, `"hidden_act": null: want a string`},
		{gpt2Fixture, map[string]any{"n_embd": "16"}, `"n_embd": "16" is a JSON string: want a positive whole number`},
		{gpt2Fixture, map[string]any{"layer_norm_epsilon": null}, `"layer_norm_epsilon": null: want a positive number`},
	} {
		f := tc.f
		f.extra = tc.extra
		b, _ := json.Marshal(f.config())
		_, err := ParseConfig("m/config.json", b)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "m/config.json") {
			t.Errorf("%v: %v, want an error naming m/config.json and saying %s", tc.extra, err, tc.want)
		}
	}
	for _, tc := range []struct {
		f     fixture
		extra map[string]any
	}{
		{llamaFixture, map[string]any{"head_dim": null, "num_key_value_heads": null, "rope_scaling": null, "torch_dtype": null}},
		{mistralFixture, map[string]any{"sliding_window": null}},
		{gpt2Fixture, map[string]any{"n_inner": null}},
	} {
		f := tc.f
		f.extra = tc.extra
		b, _ := json.Marshal(f.config())
		if _, err := ParseConfig("m/config.json", b); err != nil {
			t.Errorf("%v: %v", tc.extra, err)
		}
	}
}

// TestHFConfigMalformed: a config.json that is not JSON says where and
// why (file:line:col and encoding/json's message), and ProbeDir tells
// such a directory from one without a config.json.
func TestHFConfigMalformed(t *testing.T) {
	bad := "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": 16,\n}\n"
	_, err := ParseConfig("m/config.json", []byte(bad))
	if err == nil || !strings.Contains(err.Error(), "m/config.json:4:1: invalid JSON: invalid character '}'") {
		t.Errorf("malformed: %v", err)
	}
	dir := t.TempDir()
	if ok, err := ProbeDir(dir); ok || err != nil {
		t.Errorf("no config.json: %v %v", ok, err)
	}
	os.WriteFile(filepath.Join(dir, ConfigName), []byte(bad), 0o644)
	ok, err := ProbeDir(dir)
	if ok || err == nil || !strings.Contains(err.Error(), filepath.Join(dir, ConfigName)+":4:1: invalid JSON") {
		t.Errorf("malformed config.json: %v %v", ok, err)
	}
	os.WriteFile(filepath.Join(dir, ConfigName), []byte(`{"train_batch_size": 8}`), 0o644)
	if ok, err := ProbeDir(dir); ok || err != nil {
		t.Errorf("a training config: %v %v", ok, err)
	}
	os.WriteFile(filepath.Join(dir, ConfigName), []byte(`{"model_type": "llama"}`), 0o644)
	if ok, err := ProbeDir(dir); !ok || err != nil {
		t.Errorf("a model's config.json: %v %v", ok, err)
	}
}
