package config_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestFreezeKey: strata.freeze is a list of patterns, kept in order,
// written back by Config.JSON so that the printed config reproduces the
// run; a config without it freezes nothing and prints no key. Bad values
// name the key and element.
func TestFreezeKey(t *testing.T) {
	js := `{"train_micro_batch_size_per_gpu": 1, "strata": {"model": "tiny", "freeze": ["embed_tokens", "layers.0.", "h.[0-3].*"]}}`
	c, err := config.Parse([]byte(js), "f.json", config.Options{LookupShape: lookup})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"embed_tokens", "layers.0.", "h.[0-3].*"}
	if !slices.Equal(c.Strata.Freeze, want) {
		t.Fatalf("freeze %q, want %q", c.Strata.Freeze, want)
	}
	again, err := config.Parse(c.JSON(), "printed.json", config.Options{LookupShape: lookup})
	if err != nil || !slices.Equal(again.Strata.Freeze, want) {
		t.Fatalf("the printed config reads back as %q (%v)", again.Strata.Freeze, err)
	}
	plain, err := config.Parse([]byte(`{"train_micro_batch_size_per_gpu": 1}`), "p.json", config.Options{LookupShape: lookup})
	if err != nil || plain.Strata.Freeze != nil || strings.Contains(string(plain.JSON()), "freeze") {
		t.Fatalf("no strata.freeze: %q, printed %s (%v)", plain.Strata.Freeze, plain.JSON(), err)
	}
	for _, c := range []struct{ freeze, want string }{
		{`"wte"`, `f.json:1:60: strata.freeze: want a list of tensor-name patterns such as ["embed_tokens", "layers.0."], got string "wte"`},
		{`["wte", 3]`, `f.json:1:68: strata.freeze[1]: want a pattern string, got number 3`},
		{`["wte", " "]`, `f.json:1:68: strata.freeze[1]: the pattern is empty`},
		{`["a["]`, `f.json:1:61: strata.freeze[0]: "a[" is not a valid glob (path.Match: syntax error in pattern)`},
	} {
		js := `{"train_micro_batch_size_per_gpu": 1, "strata": {"freeze": ` + c.freeze + `}}`
		_, err := config.Parse([]byte(js), "f.json", config.Options{LookupShape: lookup})
		if err == nil || err.Error() != "config: "+c.want {
			t.Errorf("freeze %s: got %v, want config: %s", c.freeze, err, c.want)
		}
	}
	// Validate refuses a bad pattern set in a Config built in Go.
	d := config.Default()
	d.Strata.Freeze = []string{"ok", "[bad"}
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), `strata.freeze[1]: "[bad" is not a valid glob`) {
		t.Errorf("Validate: %v", err)
	}
}
