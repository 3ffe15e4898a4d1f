package data

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInvalidUTF8Line: a JSONL line that is not UTF-8 is refused, naming
// the file, the line and the byte offset of the first bad byte within the
// line, never read with U+FFFD in place of its bytes (in a string or
// anywhere else in the line).
func TestInvalidUTF8Line(t *testing.T) {
	good := `{"text": "fine"}` + "\n"
	for _, c := range []struct{ line, want string }{
		{"{\"text\": \"bad \xff byte\"}", "invalid UTF-8 at byte 14 of the line (0xff)"},
		{"{\"prompt\": \"a\", \"completion\": \"cut \xe2\x82\"}", "invalid UTF-8 at byte 35 of the line (0xe2)"},
		{"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc0\xafx\"}]}", "invalid UTF-8 at byte 43 of the line (0xc0)"},
	} {
		p := writeFile(t, "bad.jsonl", good+c.line+"\n"+good)
		_, err := Open(p, Options{Dir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), p+":2: "+c.want) {
			t.Errorf("%q: error %v, want %q", c.line, err, p+":2: "+c.want)
		}
	}
}

// TestJSONLByteOrderMark: a UTF-8 byte-order mark before the first line
// is skipped, as Python's utf-8-sig reads it; one anywhere else is not
// JSON and says so.
func TestJSONLByteOrderMark(t *testing.T) {
	p := writeFile(t, "bom.jsonl", "\ufeff"+`{"text": "hello"}`+"\n"+`{"text": "again"}`+"\n")
	s, err := Open(p, Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("a leading BOM: %v", err)
	}
	defer s.Close()
	if s.Stats.Examples != 2 {
		t.Errorf("%d examples, want 2", s.Stats.Examples)
	}
	p = writeFile(t, "bom2.jsonl", `{"text": "hello"}`+"\n\ufeff"+`{"text": "again"}`+"\n")
	if _, err := Open(p, Options{Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), p+":2: ") || !strings.Contains(err.Error(), "byte-order mark") {
		t.Errorf("a BOM on line 2: %v, want an error naming %s:2 and the byte-order mark", err, p)
	}
}

// TestEmptyChatTemplate: an empty chat_template (in tokenizer_config.json,
// as the "default" of a list, or an empty chat_template.jinja) is refused
// with the file, never read as "use ChatML".
func TestEmptyChatTemplate(t *testing.T) {
	for _, cfg := range []string{
		`{"eos_token": "E", "chat_template": ""}`,
		`{"eos_token": "E", "chat_template": [{"name": "default", "template": ""}]}`,
	} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644)
		_, err := LoadChatTemplate(dir)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "tokenizer_config.json")) || !strings.Contains(err.Error(), "empty") {
			t.Errorf("%s: %v, want an error naming the file and saying the template is empty", cfg, err)
		}
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "chat_template.jinja")
	os.WriteFile(p, nil, 0o644)
	if _, err := LoadChatTemplate(p); err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty .jinja: %v", err)
	}
}

// TestBinaryChatTemplate: a template file that is not UTF-8 text (a binary
// file named .jinja) is refused with its path, not rendered into
// conversations without an assistant's turn.
func TestBinaryChatTemplate(t *testing.T) {
	for _, body := range []string{"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe{{ messages }}", "ok {{ x }} \xc3("} {
		dir := t.TempDir()
		p := filepath.Join(dir, "chat_template.jinja")
		os.WriteFile(p, []byte(body), 0o644)
		for _, path := range []string{p, dir} {
			_, err := LoadChatTemplate(path)
			if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "not UTF-8 text") {
				t.Errorf("%s (%q): %v, want an error naming %s", path, body, err, p)
			}
		}
	}
}
