package config_test

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestShapeVariants: strata.model's explicit shape takes each family's
// arch and attention variants (a run of Gemma 3 or Phi-3 records them and
// resumes), and refuses them on GPT-2 and an arch it does not know, naming
// the key.
func TestShapeVariants(t *testing.T) {
	good := `{"train_micro_batch_size_per_gpu": 1, "strata": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256, "max_seq_len": 64,
		"arch": "gemma3", "n_kv_head": 2, "head_dim": 16, "sliding_window": 5, "layer_types": "sf", "rope_local_base_freq": 10000,
		"query_pre_attn_scalar": 24, "final_logit_softcapping": 30, "partial_rotary_factor": 0.5,
		"rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 16, "short_factor": "1,1.5", "long_factor": "2,3"}}}}`
	c, err := config.Parse([]byte(good), "a.json", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sh := c.Shape()
	if sh == nil || sh.Arch != "gemma3" || sh.HeadDimension != 16 || sh.SlidingWindow != 5 || sh.LayerTypes != "sf" || sh.QueryScale != 24 ||
		sh.FinalSoftCap != 30 || sh.RotaryFraction != 0.5 || sh.Rope.Type != "longrope" || sh.Rope.OriginalMax != 16 || sh.Rope.LongFactor != "2,3" {
		t.Errorf("read as %+v", sh)
	}
	for _, tc := range []struct{ model, want string }{
		{`"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256, "max_seq_len": 64, "sliding_window": 5`, "strata.model.arch: n_kv_head, rope_theta, tie_word_embeddings and the attention variants need an arch of the Llama family"},
		{`"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256, "max_seq_len": 64, "arch": "falcon"`, `strata.model.arch`},
		{`"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256, "max_seq_len": 64, "arch": "llama", "rope_scaling": {"rope_type": "llama3", "alpha": 2}`, `unknown key "strata.model.rope_scaling.alpha"`},
	} {
		_, err := config.Parse([]byte(`{"train_micro_batch_size_per_gpu": 1, "strata": {"model": {`+tc.model+`}}}`), "b.json", config.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.model, err, tc.want)
		}
	}
}

// TestResolveModelWritesShape: a config whose strata.model names one model
// ("tiny", not looked up) resolved to another shape (a model opened from a
// Hugging Face directory) is written out naming that shape, so that the
// run's saved config reads back as the model it trained (issue 41); one
// resolved to the shape its name looks up keeps the name.
func TestResolveModelWritesShape(t *testing.T) {
	const js = `{"train_micro_batch_size_per_gpu": 1, "strata": {"model": "tiny"}}`
	tiny := config.Shape{Name: "tiny", Layers: 2, Dim: 64, Heads: 4, Vocab: 256, MaxSeq: 128}
	lookup := func(name string) (config.Shape, error) { return tiny, nil }
	other := config.Shape{Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 64, Arch: "llama", KVHeads: 2, FFN: 48, RopeTheta: 10000}
	c, err := config.Parse([]byte(js), "a.json", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.ResolveModel(other)
	back, err := config.Parse(c.JSON(), "saved.json", config.Options{LookupShape: lookup})
	if err != nil {
		t.Fatalf("the saved config does not read back: %v\n%s", err, c.JSON())
	}
	if sh := back.Shape(); sh == nil || *sh != other {
		t.Errorf("the saved config reads back as %+v, resolved to %+v:\n%s", sh, other, c.JSON())
	}
	named, err := config.Parse([]byte(js), "a.json", config.Options{LookupShape: lookup})
	if err != nil {
		t.Fatal(err)
	}
	named.ResolveModel(tiny)
	if !strings.Contains(string(named.JSON()), `"model": "tiny"`) {
		t.Errorf("a name resolved to its own shape is not kept:\n%s", named.JSON())
	}
}
