package data

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// threeTurns is a conversation of three user questions and three
// answers, with a system message when system is not empty.
func threeTurns(system string) string {
	var b strings.Builder
	b.WriteString(`{"messages": [`)
	if system != "" {
		fmt.Fprintf(&b, `{"role": "system", "content": %q}, `, system)
	}
	b.WriteString(`{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}, ` +
		`{"role": "user", "content": "Of Germany?"}, {"role": "assistant", "content": "Berlin."}, ` +
		`{"role": "user", "content": "Of Italy?"}, {"role": "assistant", "content": "Rome."}]}`)
	return b.String()
}

func familyTemplate(t *testing.T, file string, special map[string]string) *ChatTemplate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/templates", file))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseChatTemplate(string(b), file, special)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// trainedRuns are the texts of the runs of trained bytes of an example
// tokenized with the byte-level tokenizer, and the whole text.
func trainedRuns(ex example) (runs []string, text string) {
	var b, run []byte
	for i, id := range ex.ids {
		b = append(b, byte(id))
		if ex.train[i] {
			run = append(run, byte(id))
		}
		if len(run) > 0 && (!ex.train[i] || i == len(ex.ids)-1) {
			runs, run = append(runs, string(run)), nil
		}
	}
	return runs, string(b)
}

// checkRuns says how the trained runs of ex differ from want: each
// assistant's content and its end of turn as the whole rendering holds
// them, nothing else.
func checkRuns(ex example, full string, want []string) error {
	runs, text := trainedRuns(ex)
	if text != full {
		return fmt.Errorf("tokens %q, want the rendering %q", text, full)
	}
	if !slices.Equal(runs, want) {
		return fmt.Errorf("trained %q, want %q", runs, want)
	}
	return nil
}

// TestChatTurnsOfUnstableTemplates: the real templates that render a
// conversation's prefixes differently (Qwen3's think block on the last
// turn, Phi-3's and Phi-4-mini's eos_token at the end, Mixtral 8x22B's
// system message in the last user turn) train a 3-turn conversation on
// exactly each assistant's content and its end of turn as the whole
// rendering holds them (the last one's up to the end of the text); the
// check is shown to fail when a trained span is off by one byte either
// way.
func TestChatTurnsOfUnstableTemplates(t *testing.T) {
	for _, tc := range []struct {
		file    string
		special map[string]string
		system  string
		want    []string
	}{
		{"qwen3.jinja", map[string]string{"eos_token": "<|im_end|>"}, "",
			[]string{"Paris.<|im_end|>\n", "Berlin.<|im_end|>\n", "Rome.<|im_end|>\n"}},
		{"qwen3.jinja", map[string]string{"eos_token": "<|im_end|>"}, "Be brief.",
			[]string{"Paris.<|im_end|>\n", "Berlin.<|im_end|>\n", "Rome.<|im_end|>\n"}},
		{"phi3.jinja", map[string]string{"bos_token": "<s>", "eos_token": "<|endoftext|>"}, "",
			[]string{"Paris.<|end|>\n", "Berlin.<|end|>\n", "Rome.<|end|>\n<|endoftext|>"}},
		{"phi35.jinja", map[string]string{"bos_token": "<s>", "eos_token": "<|endoftext|>"}, "Be brief.",
			[]string{"Paris.<|end|>\n", "Berlin.<|end|>\n", "Rome.<|end|>\n<|endoftext|>"}},
		{"phi4-mini.jinja", map[string]string{"eos_token": "<|endoftext|>"}, "",
			[]string{"Paris.<|end|>", "Berlin.<|end|>", "Rome.<|end|><|endoftext|>"}},
		{"mixtral-8x22b.jinja", map[string]string{"bos_token": "<s>", "eos_token": "</s>"}, "Be brief.",
			[]string{"Paris.</s>", "Berlin.</s>", "Rome.</s>"}},
	} {
		name := tc.file
		if tc.system != "" {
			name += " with a system message"
		}
		c := familyTemplate(t, tc.file, tc.special)
		line := threeTurns(tc.system)
		msgs, err := parseMessages([]byte(line[len(`{"messages": `) : len(line)-1]))
		if err != nil {
			t.Fatal(err)
		}
		full, err := c.Render(context.Background(), msgs, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, unstable, err := c.prefixSpans(context.Background(), msgs, full); err != nil || unstable < 0 {
			t.Errorf("%s: the prefix method tells the turns (%v): the case does not test the fallback", name, err)
		}
		ex, _, err := newEncoder(Bytes{}, c).line([]byte(line), "f:1")
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if err := checkRuns(ex, full, tc.want); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		// The check fails on a trained span moved by one byte, at
		// either end, either way.
		for i := 1; i < len(ex.train); i++ {
			if ex.train[i] == ex.train[i-1] {
				continue
			}
			for _, j := range []int{i - 1, i} { // widen or narrow at this boundary
				off := example{ids: ex.ids, train: slices.Clone(ex.train)}
				off.train[j] = !off.train[j]
				if checkRuns(off, full, tc.want) == nil {
					t.Errorf("%s: a span off by one at byte %d passes the check", name, j)
				}
			}
		}
	}
}

// TestChatTurnsWithReasoning: Qwen3's think block, from reasoning_content,
// is on the last turn only; the trained text is still each content and
// its end of turn (the block, written before the content, is not).
func TestChatTurnsWithReasoning(t *testing.T) {
	c := familyTemplate(t, "qwen3.jinja", nil)
	line := `{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4.", "reasoning_content": "Add."}, ` +
		`{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6.", "reasoning_content": "Add again."}]}`
	ex, _, err := newEncoder(Bytes{}, c).line([]byte(line), "f:1")
	if err != nil {
		t.Fatal(err)
	}
	runs, text := trainedRuns(ex)
	if want := []string{"4.<|im_end|>\n", "6.<|im_end|>\n"}; !slices.Equal(runs, want) {
		t.Errorf("trained %q, want %q", runs, want)
	}
	if !strings.Contains(text, "<think>\nAdd again.\n</think>\n\n6.") || strings.Contains(text, "Add.") {
		t.Errorf("rendering %q: want the think block on the last turn only", text)
	}
}

// TestChatTurnsSentinelInContent: a conversation holding the text the
// sentinels are made of still has its turns told.
func TestChatTurnsSentinelInContent(t *testing.T) {
	c := familyTemplate(t, "phi3.jinja", map[string]string{"eos_token": "<|endoftext|>"})
	line := `{"messages": [{"role": "user", "content": "\u0000strata-turn-0-0\u0000"}, {"role": "assistant", "content": "\u0000strata-turn-1-0\u0000!"}, ` +
		`{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]}`
	ex, _, err := newEncoder(Bytes{}, c).line([]byte(line), "f:1")
	if err != nil {
		t.Fatal(err)
	}
	runs, _ := trainedRuns(ex)
	if want := []string{"\x00strata-turn-1-0\x00!<|end|>\n", "c<|end|>\n<|endoftext|>"}; !slices.Equal(runs, want) {
		t.Errorf("trained %q, want %q", runs, want)
	}
}

// TestChatTurnsRefused: a template that is not prefix-stable and changes
// an assistant's content, reads it, or ends no turn is refused with one
// error naming the message and saying why.
func TestChatTurnsRefused(t *testing.T) {
	qwen := familyTemplate(t, "qwen3.jinja", nil)
	for _, tc := range []struct {
		name string
		c    *ChatTemplate
		line string
		want []string
	}{
		{"changed", mustTemplate(t, "{% for m in messages %}{% if loop.last %}<last>{% endif %}{{ m.content | upper }}<end>{% endfor %}"),
			`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}`,
			[]string{"f:2: message 2 (the assistant's)", "content not as given", "cannot be told"}},
		{"no end of turn", mustTemplate(t, "{% for m in messages %}{% if loop.last %}<last>{% endif %}{{ m.content }}{% endfor %}"),
			`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}`,
			[]string{"f:2: message 2 (the assistant's)", "no end of turn", "cannot be told"}},
		{"twice", mustTemplate(t, "{% for m in messages %}{% if loop.last %}<last>{% endif %}{{ m.content }}{{ m.content }};{% endfor %}"),
			`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}`,
			[]string{"f:2: message 2 (the assistant's)", "more than once", "cannot be told"}},
		{"think in the content", qwen,
			`{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "<think>r</think>d"}]}`,
			[]string{"f:2: message 4 (the assistant's)", "reasoning_content", "cannot be told"}},
	} {
		_, _, err := newEncoder(Bytes{}, tc.c).line([]byte(tc.line), "f:2")
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want it to say %q", tc.name, err, w)
			}
		}
	}
}

func mustTemplate(t *testing.T, src string) *ChatTemplate {
	t.Helper()
	c, err := ParseChatTemplate(src, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
