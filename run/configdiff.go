package run

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ConfigDiff lists the settings where two configs (JSON) differ, but the
// total step count: "optimizer.params.lr 0.003 -> 0.001, ..." ("" when
// none). A resumed run given another config says it (Resume.ConfigDiff).
func ConfigDiff(saved, now []byte) string {
	var a, b any
	if json.Unmarshal(saved, &a) != nil || json.Unmarshal(now, &b) != nil {
		return ""
	}
	fa, fb := Flatten(a), Flatten(b)
	keys := map[string]bool{}
	for k := range fa {
		keys[k] = true
	}
	for k := range fb {
		keys[k] = true
	}
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if k != "strata.steps" && fa[k] != fb[k] {
			diffs = append(diffs, fmt.Sprintf("%s %s -> %s", k, orNone(fa[k]), orNone(fb[k])))
		}
	}
	if len(diffs) > 6 {
		diffs = append(diffs[:6], fmt.Sprintf("and %d more", len(diffs)-6))
	}
	return strings.Join(diffs, ", ")
}

// Flatten is a decoded JSON value (a config) by dotted key
// ("optimizer.params.lr"), each leaf as JSON.
func Flatten(v any) map[string]string {
	out := map[string]string{}
	flatten("", v, out)
	return out
}

func flatten(prefix string, v any, out map[string]string) {
	if m, ok := v.(map[string]any); ok {
		for k, x := range m {
			if prefix != "" {
				k = prefix + "." + k
			}
			flatten(k, x, out)
		}
		return
	}
	b, _ := json.Marshal(v)
	out[prefix] = string(b)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
