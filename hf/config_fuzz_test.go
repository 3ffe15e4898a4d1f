package hf

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
)

// FuzzParseConfig: a model's config.json (a download, so anything) reads to
// a valid shape or to an error naming the file, never panics, reads the
// same way twice, and a shape it reads is written back (ConfigJSON over
// the same file) to a config.json that reads to the same shape. Seeded
// with the fixtures' configs and TestHFConfigRefuses' edits of them.
func FuzzParseConfig(f *testing.F) {
	for _, fx := range []fixture{gpt2Fixture, llamaFixture, qwen2Fixture, mistralFixture} {
		b, _ := json.Marshal(fx.config())
		f.Add(b)
	}
	for _, e := range []struct {
		f     fixture
		extra map[string]any
	}{
		{llamaFixture, map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0}}},
		{llamaFixture, map[string]any{"head_dim": 8}},
		{gpt2Fixture, map[string]any{"activation_function": "relu", "n_inner": 48}},
		{llamaFixture, map[string]any{"architectures": []string{"FalconForCausalLM"}}},
		{llamaFixture, map[string]any{"architectures": nil}},
		{qwen2Fixture, map[string]any{"use_sliding_window": true}},
		{llamaFixture, map[string]any{"hidden_size": nil}},
		{llamaFixture, map[string]any{"num_hidden_layers": 2.5}},
		{gpt2Fixture, map[string]any{"tie_word_embeddings": false}},
		{llamaFixture, map[string]any{"num_key_value_heads": 3}},
		{mistralFixture, map[string]any{"sliding_window": 16}},
	} {
		fx := e.f
		fx.extra = e.extra
		b, _ := json.Marshal(fx.config())
		f.Add(b)
	}
	f.Add([]byte(`[1]`))
	f.Add([]byte(`{"model_type": "llama"}`))
	// Unknown keys: each run must name them in one order (a map's order once made the message differ).
	f.Add([]byte(`{"model_type": "llama", "rope_scaling": {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		c, err := ParseConfig("m/config.json", b)
		c2, err2 := ParseConfig("m/config.json", b)
		if err != nil {
			if c != nil || !strings.Contains(err.Error(), "m/config.json") {
				t.Fatalf("error %q (not naming the file) with a config %v", err, c)
			}
			if err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("read twice: %v, then %v", err, err2)
			}
			return
		}
		if err2 != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("read twice: %+v, then %+v, %v", c, c2, err2)
		}
		if err := c.Shape.Validate(); err != nil {
			t.Fatalf("accepted an invalid shape %+v: %v", c.Shape, err)
		}
		out, err := ConfigJSON(c.Shape, dtype.BF16, b)
		if err != nil {
			return // a base that ConfigJSON cannot merge into: refused, fine
		}
		back, err := ParseConfig("out/config.json", out)
		if err != nil {
			t.Fatalf("written back, refused: %v\n%s", err, out)
		}
		if back.Shape.Canonical() != c.Shape.Canonical() {
			t.Fatalf("written back as %+v, read %+v", back.Shape, c.Shape)
		}
	})
}
