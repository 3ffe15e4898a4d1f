package estimate

import (
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/dtype"
)

// TestBaseDTypeNames: config's names of strata.lora.base_dtype and the
// codec table agree (bf16 and one name per codec), so no accepted name is
// estimated as another format; a name with no codec panics.
func TestBaseDTypeNames(t *testing.T) {
	if config.BaseDTypes[0] != config.BaseBF16 || BaseDType(config.BaseBF16) != 0 || BaseDType("") != 0 {
		t.Fatalf("bf16 is not BaseDTypes' first name or not 0: %v", config.BaseDTypes)
	}
	for _, name := range config.BaseDTypes[1:] {
		if d := BaseDType(name); d.String() != name || !d.Coded() {
			t.Errorf("BaseDType(%q) = %s", name, d)
		}
	}
	if len(config.BaseDTypes)-1 != len(dtype.Codecs) {
		t.Errorf("config names %v, codecs %d", config.BaseDTypes, len(dtype.Codecs))
	}
	defer func() {
		if recover() == nil {
			t.Error(`BaseDType("fp8") did not panic`)
		}
	}()
	BaseDType("fp8")
}
