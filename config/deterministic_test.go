package config_test

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestDeterministicKey: strata.deterministic is true unless a config says
// false (the bit-identical guarantee holds by default), the printed config
// keeps it, and a value that is not a boolean names the key.
func TestDeterministicKey(t *testing.T) {
	if !config.Default().Strata.Deterministic {
		t.Error("default config: strata.deterministic is false")
	}
	parse := func(strata string) (*config.Config, error) {
		js := `{"train_micro_batch_size_per_gpu": 1, "strata": {` + strata + `}}`
		return config.Parse([]byte(js), "d.json", config.Options{LookupShape: lookup})
	}
	for strata, want := range map[string]bool{``: true, `"deterministic": true`: true, `"deterministic": false`: false} {
		c, err := parse(strata)
		if err != nil {
			t.Fatal(err)
		}
		if c.Strata.Deterministic != want {
			t.Errorf("strata {%s}: deterministic %t, want %t", strata, c.Strata.Deterministic, want)
		}
		again, err := config.Parse(c.JSON(), "printed.json", config.Options{LookupShape: lookup})
		if err != nil || again.Strata.Deterministic != want {
			t.Errorf("strata {%s}: the printed config reads back as %t (%v)", strata, again.Strata.Deterministic, err)
		}
	}
	_, err := parse(`"deterministic": "no"`)
	if want := `config: d.json:1:67: strata.deterministic: want true or false, got string "no"`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	_, err = parse(`"determinstic": false`)
	if err == nil || !strings.Contains(err.Error(), `did you mean "strata.deterministic"?`) {
		t.Errorf("a misspelled key: %v", err)
	}
}
