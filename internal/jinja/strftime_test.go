package jinja

import (
	"strings"
	"testing"
	"time"
)

// TestStrftimeRefused: a directive strftime does not build is an error
// naming strftime_now (data's TestTemplateWithDate renders the ones it
// builds).
func TestStrftimeRefused(t *testing.T) {
	at := time.Date(2024, 7, 6, 15, 4, 5, 123456000, time.UTC)
	for _, format := range []string{"%c", "%-Y", "%"} {
		if _, err := strftime(at, format); err == nil || !strings.Contains(err.Error(), "strftime_now:") {
			t.Errorf("strftime %q: %v; want an error naming it", format, err)
		}
	}
}
