package data

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadChatTemplateNoConfig: a model directory without
// tokenizer_config.json (and without chat_template.jinja) gets
// DefaultChatTemplate, as the doc promises, not an error; a path that does
// not exist is still one.
func TestLoadChatTemplateNoConfig(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "llama"}`), 0o644)
	c, err := LoadChatTemplate(dir)
	if err != nil {
		t.Fatalf("a model without tokenizer_config.json: %v, want ChatML", err)
	}
	if c.Text() != ChatMLTemplate || c.Source() != DefaultChatTemplate().Source() {
		t.Errorf("source %q, text %q: want the default", c.Source(), c.Text())
	}
	if _, err := LoadChatTemplate(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing path loaded")
	}
	if _, err := LoadChatTemplate(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		t.Error("a missing tokenizer_config.json named by its path loaded")
	}
}

// TestChatTemplateJSON: a template recorded as JSON (a checkpoint's
// manifest: source, template, special_tokens) reads back as the same
// template; one the interpreter cannot parse reads back and fails when
// rendered, naming the parse error.
func TestChatTemplateJSON(t *testing.T) {
	c, err := ParseChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", "t.jinja", map[string]string{"bos_token": "<s>"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"source":"t.jinja","template":"{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}","special_tokens":{"bos_token":"\u003cs\u003e"}}`; string(b) != want {
		t.Errorf("JSON %s, want %s", b, want)
	}
	if b, _ := json.Marshal(DefaultChatTemplate()); strings.Contains(string(b), "special_tokens") {
		t.Errorf("default: %s has special_tokens", b)
	}
	var back ChatTemplate
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	msgs := []any{newMessage("user", "x")}
	if got, err := back.Render(context.Background(), msgs, false); err != nil || got != "<s>x" || back.Source() != "t.jinja" {
		t.Errorf("read back: %q %v (source %q)", got, err, back.Source())
	}
	var bad ChatTemplate
	if err := json.Unmarshal([]byte(`{"source":"old","template":"{% call m() %}{% endcall %}"}`), &bad); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Render(context.Background(), msgs, false); err == nil || !strings.Contains(err.Error(), "not supported") || bad.Text() == "" {
		t.Errorf("unparsable record: %v", err)
	}
}
