package main

import (
	"os"
	"strings"
	"testing"
)

// TestLibraryDocIsTheExample: docs/library.md's "The whole job" shows
// job.go from its config on, as it is, so the page cannot drift from the
// code CI runs.
func TestLibraryDocIsTheExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/library.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("job.go")
	if err != nil {
		t.Fatal(err)
	}
	code := string(src)
	code = strings.TrimRight(code[strings.Index(code, "// loraConfig:"):], "\n")
	_, after, ok := strings.Cut(string(doc), "\n## The whole job\n")
	if !ok {
		t.Fatal(`docs/library.md: no "## The whole job"`)
	}
	_, block, ok := strings.Cut(after, "```go\n")
	block, _, ok2 := strings.Cut(block, "\n```")
	if !ok || !ok2 {
		t.Fatal(`docs/library.md: no Go block under "## The whole job"`)
	}
	if block != code {
		t.Errorf("docs/library.md's whole job differs from examples/lora/job.go: copy the file's text from \"// loraConfig:\" on into the page")
	}
	if n := strings.Count(block, "\n") + 1; n > 80 {
		t.Errorf("the whole job is %d lines of Go: at most 80 (issue 41)", n)
	}
}
