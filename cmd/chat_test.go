package cmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/tokenizer"
)

// TestChatByteModelNoteExportGenerate: a byte-vocabulary model trained on
// {"messages"} lines with the default ChatML gets a note naming the markers
// it encodes byte by byte (train and generate --chat); the export carries
// ChatML as transformers reads it (tokenizer_config.json's chat_template,
// chat_template.jinja) and a generation_config.json; generate --chat
// renders --prompt as one user turn with the generation prompt: the same
// prompt tokens and text as generate --no-special given the rendered text,
// on the run and on its export.
func TestChatByteModelNoteExportGenerate(t *testing.T) {
	dir := t.TempDir()
	train := writeFile(t, "chat.jsonl", chatJSONL(20, 1))
	cfg := writeFile(t, "cfg.json", fmt.Sprintf(frozenConfig, `, "model": "tiny"`))
	run := filepath.Join(dir, "run")
	_, stderr, err := runApp(t, "train", "--config", cfg, "--data", train, "--steps", "1", "--save-every", "1", "--out", run)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "ChatML markers <|im_start|>, <|im_end|> are not tokens of the tokenizer") {
		t.Errorf("train names no byte-encoded ChatML markers:\n%s", stderr)
	}
	hfDir := filepath.Join(dir, "hf")
	out, stderr, err := runApp(t, "export", "--format", "hf", run, hfDir)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, stderr)
	}
	if tc := readRunJSON(t, filepath.Join(hfDir, "tokenizer_config.json")); tc["chat_template"] != data.ChatMLTemplate {
		t.Errorf("tokenizer_config.json: %v; want ChatML as chat_template (export said %s)", tc, out)
	}
	if b, err := os.ReadFile(filepath.Join(hfDir, "chat_template.jinja")); err != nil || string(b) != data.ChatMLTemplate {
		t.Errorf("chat_template.jinja: %q, %v", b, err)
	}
	if gc := readRunJSON(t, filepath.Join(hfDir, "generation_config.json")); gc["_from_model_config"] != true {
		t.Errorf("generation_config.json: %v", gc)
	}
	const rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	plain, plainErr, err := runApp(t, "generate", "--model", run, "--no-special", "--prompt", rendered, "--max-new-tokens", "8")
	if err != nil {
		t.Fatalf("generate: %v\n%s", err, plainErr)
	}
	wantPrompt := fmt.Sprintf("after a prompt of %d ", len(rendered))
	for _, m := range []string{run, hfDir} {
		got, stderr, err := runApp(t, "generate", "--model", m, "--chat", "--prompt", "hi", "--max-new-tokens", "8")
		if err != nil {
			t.Fatalf("generate --chat --model %s: %v\n%s", m, err, stderr)
		}
		if got != plain || !strings.Contains(stderr, wantPrompt) || !strings.Contains(plainErr, wantPrompt) {
			t.Errorf("generate --chat --model %s printed %q (%s); generate of the rendered prompt %q (%s)", m, got, stderr, plain, plainErr)
		}
		if !strings.Contains(stderr, "note: the chat template's ChatML markers <|im_start|>, <|im_end|> are not tokens") {
			t.Errorf("generate --chat --model %s names no byte-encoded markers:\n%s", m, stderr)
		}
	}
}

// TestChatTemplateExportHF: a run started from a Hugging Face directory
// with a --chat-template of its own exports that template
// (chat_template.jinja and tokenizer_config.json's chat_template, the
// source's other keys kept) and a generation_config.json whose eos ids are
// the tokenizer's EOS and the template's one-token end of turn; eval and
// generate --chat on the export read the template back; no note (the
// template is the model's choice, not the default).
func TestChatTemplateExportHF(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "model")
	shape := initShape
	shape.Vocab = 264
	writeHFModel(t, src, shape, 11)
	for name, content := range map[string]string{
		"tokenizer.json":        byteLevelTokenizerJSON(),
		"tokenizer_config.json": `{"eos_token": "<|im_start|>", "pad_token": "<|im_start|>", "model_max_length": 64}`,
	} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(filepath.Join(src, "generation_config.json")) // from the fixture's writer: the export writes its own
	const tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}<|im_end|>{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
	tmplFile := writeFile(t, "turns.jinja", tmpl)
	cfg := writeFile(t, "cfg.json", fmt.Sprintf(frozenConfig, ""))
	run := filepath.Join(dir, "run")
	train := writeFile(t, "chat.jsonl", chatJSONL(12, 3))
	_, stderr, err := runApp(t, "train", "--init", src, "--config", cfg, "--data", train, "--chat-template", tmplFile, "--steps", "1", "--save-every", "1", "--out", run)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if strings.Contains(stderr, "note: ") && strings.Contains(stderr, "markers") {
		t.Errorf("a note on markers with the model's own template:\n%s", stderr)
	}
	hfDir := filepath.Join(dir, "hf")
	if _, stderr, err := runApp(t, "export", "--format", "hf", run, hfDir); err != nil {
		t.Fatalf("export: %v\n%s", err, stderr)
	}
	tc := readRunJSON(t, filepath.Join(hfDir, "tokenizer_config.json"))
	if tc["chat_template"] != tmpl || tc["model_max_length"] != 64.0 || tc["eos_token"] != "<|im_start|>" {
		t.Errorf("tokenizer_config.json: %v; want the source's keys and chat_template %q", tc, tmpl)
	}
	if b, err := os.ReadFile(filepath.Join(hfDir, "chat_template.jinja")); err != nil || string(b) != tmpl {
		t.Errorf("chat_template.jinja: %q, %v", b, err)
	}
	tok, err := tokenizer.Load(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	end, _ := tok.TokenID("<|im_end|>")
	gc := readRunJSON(t, filepath.Join(hfDir, "generation_config.json"))
	eos, _ := gc["eos_token_id"].([]any)
	if len(eos) == 0 || eos[len(eos)-1] != float64(end) || gc["pad_token_id"] != 256.0 {
		t.Errorf("generation_config.json: %v; want the end of turn %d last among the eos ids and pad 256", gc, end)
	}
	var stderrs []string
	for _, m := range []string{run, hfDir} {
		_, stderr, err := runApp(t, "generate", "--model", m, "--chat", "--prompt", "hi", "--max-new-tokens", "2")
		if err != nil {
			t.Fatalf("generate --chat --model %s: %v\n%s", m, err, stderr)
		}
		if want := fmt.Sprintf("after a prompt of %d ", len("[user] hi<|im_end|>[assistant] ")-len("<|im_end|>")+1); !strings.Contains(stderr, want) {
			t.Errorf("generate --chat --model %s: want %q:\n%s", m, want, stderr)
		}
		stderrs = append(stderrs, stderr)
	}
	if !strings.Contains(stderrs[0], "recorded by the run") || !strings.Contains(stderrs[1], "chat_template.jinja") {
		t.Errorf("generate --chat names other templates:\n%s", strings.Join(stderrs, "\n"))
	}
}
