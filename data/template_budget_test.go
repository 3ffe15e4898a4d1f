package data

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stopAfter is a context whose Err is nil for its first n calls and
// context.Canceled after: a stop signal that arrives in the middle of a
// rendering, at a known point.
type stopAfter struct {
	context.Context
	n, calls int
}

func (s *stopAfter) Err() error {
	if s.calls++; s.calls > s.n {
		return context.Canceled
	}
	return nil
}

// TestTemplateStopsOpen: Open stops in the middle of a line's rendering
// when its context is cancelled, with an error wrapping context.Canceled
// (internal/jinja's TestTemplateStops: every stopEverySteps steps).
func TestTemplateStopsOpen(t *testing.T) {
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "loop.jinja")
	if err := os.WriteFile(tmpl, []byte("{% for m in messages %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ m.content }}{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	chat, err := LoadChatTemplate(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "d.jsonl", `{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}`+"\n")
	ctx := &stopAfter{Context: context.Background(), n: 5} // the line's look, then four in the rendering
	s, err := Open(path, Options{Chat: chat, Dir: t.TempDir(), Context: ctx})
	if err == nil {
		s.Close()
		t.Fatal("Open rendered the template to its end after the stop")
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "rendering stopped after") {
		t.Errorf("Open: %v, want the rendering's stop (context.Canceled)", err)
	}
}
