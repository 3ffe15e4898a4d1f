package data

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/model"
)

// writeFile writes a test file and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// trainedText is the text of an example's tokens, with the trained ones
// (loss bit set) in [brackets], under the byte-level tokenizer.
func trainedText(ex example) string {
	var b strings.Builder
	in := false
	for i, id := range ex.ids {
		if ex.train[i] != in {
			b.WriteString(map[bool]string{true: "[", false: "]"}[ex.train[i]])
			in = ex.train[i]
		}
		b.WriteByte(byte(id))
	}
	if in {
		b.WriteByte(']')
	}
	return b.String()
}

// TestEncodeLines: each kind of line under the byte-level tokenizer: text
// trained whole, a prompt not and its completion trained, a conversation
// rendered with ChatML (and with the Llama-3 template) with the
// assistant's content and end of turn trained and everything else not.
func TestEncodeLines(t *testing.T) {
	llama3, err := os.ReadFile("testdata/templates/llama3.jinja")
	if err != nil {
		t.Fatal(err)
	}
	l3, err := ParseChatTemplate(string(llama3), "llama3", map[string]string{"bos_token": "<B>"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		chat       *ChatTemplate
		line, want string
		kind       int
	}{
		{nil, `{"text": "hello"}`, "[hello]", KindText},
		{nil, `{"prompt": "2+2=", "completion": "4", "id": 7}`, "2+2=[4]", KindCompletion},
		{nil, `{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}`,
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n[Hello!<|im_end|>\n]", KindChat},
		{nil, `{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}`,
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n[b<|im_end|>\n]<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n[d<|im_end|>\n]", KindChat},
		{l3, `{"messages": [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Yo"}]}`,
			"<B><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n[Yo<|eot_id|>]", KindChat},
	} {
		ex, kind, err := newEncoder(Bytes{}, c.chat).line([]byte(c.line), "f:1")
		if err != nil {
			t.Errorf("%s: %v", c.line, err)
			continue
		}
		if got := trainedText(ex); got != c.want || kind != c.kind {
			t.Errorf("%s:\n got %q (kind %d)\nwant %q (kind %d)", c.line, got, kind, c.want, c.kind)
		}
	}
}

// TestBadLines: every malformed line is one error naming the file, the
// line number and what is wrong; the lines before it are not the cause.
func TestBadLines(t *testing.T) {
	good := `{"text": "fine"}` + "\n"
	for _, c := range []struct{ line, want string }{
		{`{"text": "unterminated}`, "invalid JSON"},
		{`{"text": 5}`, `"text" must be a string, not a JSON number`},
		{`[1, 2]`, "a line must be a JSON object, not a JSON array"},
		{`{"id": 1}`, `a line needs "text", "prompt" and "completion", or "messages"`},
		{`{"text": "a", "messages": []}`, "not several"},
		{`{"prompt": "a"}`, `"prompt" and "completion" go together`},
		{`{"messages": "hi"}`, `"messages" must be a non-empty list`},
		{`{"messages": []}`, `"messages" must be a non-empty list`},
		{`{"messages": [{"role": "user"}]}`, `message 1 has no "content"`},
		{`{"messages": [{"role": "user", "content": "a"}, {"role": 3, "content": "b"}]}`, `message 2: "role" must be a string, not number`},
		{`{"messages": [{"role": "user", "content": null}]}`, `message 1: "content" must be a string, not null`},
		{`{"messages": ["hi"]}`, "message 1 is a string"},
		{`{"text": "a"} trailing`, "more after the object"},
	} {
		p := writeFile(t, "bad.jsonl", good+good+c.line+"\n"+good)
		_, err := Open(p, Options{Dir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), p+":3: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %s:3 and saying %q", c.line, err, p, c.want)
		}
	}
	// A template that raises (Mistral-style on a system message) names the line too.
	src, err := os.ReadFile("testdata/templates/mistral.jinja")
	if err != nil {
		t.Fatal(err)
	}
	chat, err := ParseChatTemplate(string(src), "mistral.jinja", map[string]string{"bos_token": "<s>", "eos_token": "</s>"})
	if err != nil {
		t.Fatal(err)
	}
	p := writeFile(t, "chat.jsonl", `{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}, {"role": "assistant", "content": "z"}]}`+"\n")
	if _, err := Open(p, Options{Chat: chat, Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), p+":1: ") || !strings.Contains(err.Error(), "Conversation roles must alternate") {
		t.Errorf("raising template: %v", err)
	}
	// Nothing to train on: an error, not an empty run.
	p = writeFile(t, "empty.jsonl", `{"prompt": "a", "completion": ""}`+"\n\n")
	if _, err := Open(p, Options{Dir: t.TempDir()}); !errors.Is(err, ErrEmpty) {
		t.Errorf("no trained token: %v, want ErrEmpty", err)
	}
}

// TestDetectFormat: by extension, else by a first line that is a JSON
// object with a known key.
func TestDetectFormat(t *testing.T) {
	for _, c := range []struct {
		name, content string
		want          Format
	}{
		{"a.jsonl", "anything", JSONL},
		{"a.json-lines", "", JSONL},
		{"a.txt", "\ufeff  \n{\"messages\": []}\n", JSONL},
		{"a.dat", `{"prompt": "x", "completion": "y"}`, JSONL},
		{"a.txt", `{"other": 1}` + "\n", Text},
		{"a.txt", "{ not json\n", Text},
		{"a.txt", "plain text\n{\"text\": 1}\n", Text},
		{"a.txt", "", Text},
	} {
		got, err := DetectFormat(writeFile(t, c.name, c.content))
		if err != nil || got != c.want {
			t.Errorf("%s %q: %v %v, want %v", c.name, c.content, got, err, c.want)
		}
	}
}

// TestLoadChatTemplate: a model directory's tokenizer_config.json (a
// string template, a list with "default", special tokens as strings or
// AddedToken objects), its chat_template.jinja first, and ChatML when it
// has none.
func TestLoadChatTemplate(t *testing.T) {
	dir := t.TempDir()
	cfg := `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	msgs := []any{&object{keys: []string{"role", "content"}, m: map[string]any{"role": "user", "content": "x"}}}
	check := func(path, want string) {
		t.Helper()
		c, err := LoadChatTemplate(path)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.Render(context.Background(), msgs, false); err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", path, got, err, want)
		}
	}
	check(dir, "<s>x</s>")
	check(filepath.Join(dir, "tokenizer_config.json"), "<s>x</s>")
	list := `{"eos_token": "E", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ messages[0].content }}{{ eos_token }}"}]}`
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(list), 0o644)
	check(dir, "xE")
	os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("J{{ messages | length }}"), 0o644)
	check(dir, "J1")
	none := t.TempDir()
	os.WriteFile(filepath.Join(none, "tokenizer_config.json"), []byte(`{"eos_token": "E"}`), 0o644)
	c, err := LoadChatTemplate(none)
	if err != nil || !strings.Contains(c.Source(), "default (ChatML)") {
		t.Fatalf("no template: %v %v", c, err)
	}
	check(none, "<|im_start|>user\nx<|im_end|>\n")
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "tokenizer_config.json"), []byte(`{"chat_template": "{% call m() %}{% endcall %}"}`), 0o644)
	if _, err := LoadChatTemplate(bad); err == nil || !strings.Contains(err.Error(), filepath.Join(bad, "tokenizer_config.json")) || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("unsupported template: %v", err)
	}
}

// TestChatNotPrefixStable: a template that renders an earlier turn
// differently once later turns follow is refused, saying why.
func TestChatNotPrefixStable(t *testing.T) {
	src := "{% for m in messages %}{% if loop.last %}<last>{% endif %}{{ m.content }}{% endfor %}"
	c, err := ParseChatTemplate(src, "drops", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = newEncoder(Bytes{}, c).line([]byte(`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}`), "f:9")
	if err == nil || !strings.Contains(err.Error(), "f:9: message 2 (the assistant's)") || !strings.Contains(err.Error(), "cannot be told") {
		t.Errorf("error %v", err)
	}
}

// bytesCopy is the byte-level tokenizer under another type: Open then
// tokenizes raw text into a token file, as it does for any tokenizer but
// Bytes.
type bytesCopy struct{ Bytes }

// TestTextTokenFile: raw text tokenized into a token file (the path of
// every tokenizer but Bytes) reads as the same corpus as the file read in
// place: the sampler draws identical windows from both, across the
// chunks it was tokenized in.
func TestTextTokenFile(t *testing.T) {
	var b strings.Builder
	for i := 0; b.Len() < 3*textChunkBytes+12345; i++ {
		b.WriteString(strings.Repeat("word ", i%13) + "line\n")
		if i%7 == 0 {
			b.WriteString("  \n\n")
		}
	}
	p := writeFile(t, "corpus.txt", b.String())
	inPlace, err := Open(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer inPlace.Close()
	if _, ok := inPlace.Corpus.(*model.FileCorpus); !ok || inPlace.File != nil {
		t.Fatalf("bytes: corpus %T, token file %v; want the file read in place", inPlace.Corpus, inPlace.File)
	}
	tok, err := Open(p, Options{Tokenizer: bytesCopy{}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	if tok.File == nil || tok.Corpus.Len() != int64(b.Len()) || tok.Stats.Width != 1 {
		t.Fatalf("token file: %v, %d tokens of %d, width %d", tok.File, tok.Corpus.Len(), b.Len(), tok.Stats.Width)
	}
	s1, _ := model.NewCorpusSampler(inPlace.Corpus, 64, 3)
	s2, _ := model.NewCorpusSampler(tok.Corpus, 64, 3)
	for step := range 20 {
		b1, err1 := s1.Batch(step, 0, 8)
		b2, err2 := s2.Batch(step, 0, 8)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		for i := range b1.IDs {
			if b1.IDs[i] != b2.IDs[i] || b1.Targets[i] != b2.Targets[i] {
				t.Fatalf("step %d token %d: %d->%d in place, %d->%d from the token file", step, i, b1.IDs[i], b1.Targets[i], b2.IDs[i], b2.Targets[i])
			}
		}
	}
}

// TestTextCut: raw text is cut only after a line break between two
// non-space bytes.
func TestTextCut(t *testing.T) {
	for _, c := range []struct {
		s    string
		want int
	}{
		{"ab\ncd", 3}, {"ab\n\ncd", -1}, {"ab \ncd", -1}, {"ab\n cd", -1}, {"a\nb\n\nc", 2}, {"\nb", -1}, {"abc", -1},
	} {
		if got := textCut([]byte(c.s)); got != c.want {
			t.Errorf("textCut(%q) = %d, want %d", c.s, got, c.want)
		}
	}
}

// plain turns a decodeOrdered value into encoding/json's shapes (maps,
// float64 numbers) to compare the two decoders.
func plain(v any) any {
	switch x := v.(type) {
	case *object:
		m := map[string]any{}
		for k, w := range x.m {
			m[k] = plain(w)
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, w := range x {
			out[i] = plain(w)
		}
		return out
	case int64:
		return float64(x)
	}
	return v
}

// TestDecodeOrdered: the messages' decoder reads what encoding/json reads
// (escapes, surrogate pairs and lone surrogates, invalid UTF-8, numbers,
// nesting), keeps the keys' order, and refuses what it refuses.
func TestDecodeOrdered(t *testing.T) {
	for _, in := range []string{
		`{"b": 1, "a": [true, false, null, -2.5e3, 0, 12345678901234]}`,
		`"plain"`, `"esc \" \\ \/ \b \f \n \r \t \u00e9 \u20ac"`, `"pair \ud83d\ude00 end"`,
		`"lone \ud83d x"`, `"lone low \ude00"`, `"two highs \ud83d\ud83d"`, "\"bad \xff utf8 \xe2\x82\"", `"ünïcode ✓"`,
		`[]`, `{}`, `[[[]]]`, ` { "k" : { "x" : [ 1 , 2 ] } } `, `1.0`, `-0`, `1e400`,
	} {
		var want any
		werr := json.Unmarshal([]byte(in), &want)
		got, gerr := decodeOrdered([]byte(in))
		if (werr != nil) != (gerr != nil) {
			t.Errorf("%q: encoding/json error %v, decodeOrdered error %v", in, werr, gerr)
			continue
		}
		if werr == nil && !reflect.DeepEqual(plain(got), want) {
			t.Errorf("%q: %#v, encoding/json %#v", in, plain(got), want)
		}
	}
	for _, bad := range []string{`{"a" 1}`, `[1,]`, `{"a":1,}`, `"open`, `tru`, `{1: 2}`, "\"ctl \x01\"", `[1] x`, `"\u12"`} {
		if _, err := decodeOrdered([]byte(bad)); err == nil {
			t.Errorf("%q decoded without an error", bad)
		}
	}
	v, _ := decodeOrdered([]byte(`{"z": 1, "a": 2, "m": 3}`))
	if keys := v.(*object).keys; !slices.Equal(keys, []string{"z", "a", "m"}) {
		t.Errorf("keys %v, want the document's order", keys)
	}
}
