package cmd

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/internal/hosttest"
	"github.com/strata-ai/strata/tokenizer"
)

// TestGenerateGreedyMatchesTorch: strata generate at temperature 0 (the
// prompt in one pass, then one token at a time through the key/value
// cache) prints the text of the tokens hf_reference.py --greedy chooses
// by running the whole sequence through its PyTorch model at every step,
// up to the first EOS, for GPT-2, Llama (grouped-query attention, untied
// head) and Qwen2. The top two logits of these random models are apart by
// far more than the fp32 differences between the two implementations
// (below 1e-6 relative, TestEvalAgainstTorch), so the choices agree.
func TestGenerateGreedyMatchesTorch(t *testing.T) {
	hosttest.RequireTorch(t)
	script, err := filepath.Abs(hfReference)
	if err != nil {
		t.Fatal(err)
	}
	const prompt, maxNew = "The cat sat on the", 24
	tt := testTokenizer{merges: gpt2Merges, special: []string{"<|endoftext|>"}}
	for i, s := range evalTorchShapes {
		t.Run(s.ArchName(), func(t *testing.T) {
			dir := t.TempDir()
			hf := filepath.Join(dir, "hf")
			writeHFEvalModel(t, hf, s, uint64(50+i), dtype.F32, tt)
			tok, err := tokenizer.Load(filepath.Join(hf, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			ids := tok.Encode(prompt, false)
			promptPath, refPath := filepath.Join(dir, "prompt.json"), filepath.Join(dir, "greedy.json")
			b, _ := json.Marshal(map[string]any{"ids": ids})
			if err := os.WriteFile(promptPath, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(hosttest.TorchPython, script, "--greedy", "24", hf, promptPath, refPath).CombinedOutput(); err != nil {
				t.Fatalf("hf_reference.py --greedy: %v\n%s", err, out)
			}
			var ref struct{ Tokens []int32 }
			if b, err = os.ReadFile(refPath); err != nil || json.Unmarshal(b, &ref) != nil || len(ref.Tokens) != maxNew {
				t.Fatalf("the reference's tokens: %v (%s)", err, b)
			}
			eos, _ := tok.EOS()
			stop := "stopped after --max-new-tokens"
			if k := slices.Index(ref.Tokens, eos); k >= 0 {
				ref.Tokens, stop = ref.Tokens[:k], "stopped at EOS"
			}
			want, err := tok.Decode(ref.Tokens)
			if err != nil {
				t.Fatal(err)
			}
			out, errOut, err := runApp(t, "generate", "--model", hf, "--prompt", prompt, "--max-new-tokens", "24")
			if err != nil {
				t.Fatalf("generate: %v\n%s", err, errOut)
			}
			if out != want+"\n" {
				t.Errorf("generate printed %q, the full-recompute greedy reference %q (tokens %v)", out, want, ref.Tokens)
			}
			if !strings.Contains(errOut, stop) {
				t.Errorf("stderr does not say %q:\n%s", stop, errOut)
			}
			t.Logf("%s: %d tokens, %s", s.ArchName(), len(ref.Tokens), stop)
			if len(ref.Tokens) < 6 {
				return
			}
			// The sixth token made the EOS (tokenizer_config.json's
			// eos_token, spelled as the vocabulary spells it): generation
			// stops before its first occurrence.
			eos = ref.Tokens[5]
			if err := os.WriteFile(filepath.Join(hf, "tokenizer_config.json"), []byte(`{"eos_token": "`+vocabSpelling(eos)+`"}`), 0o644); err != nil {
				t.Fatal(err)
			}
			k := slices.Index(ref.Tokens, eos)
			if want, err = tok.Decode(ref.Tokens[:k]); err != nil {
				t.Fatal(err)
			}
			out, errOut, err = runApp(t, "generate", "--model", hf, "--prompt", prompt, "--max-new-tokens", "24")
			if err != nil {
				t.Fatalf("generate: %v\n%s", err, errOut)
			}
			if out != want+"\n" || !strings.Contains(errOut, "generated "+strconv.Itoa(k)+" tokens") || !strings.Contains(errOut, "stopped at EOS") {
				t.Errorf("with EOS %d: printed %q, want %q (the tokens before it), and stderr:\n%s", eos, out, want, errOut)
			}
		})
	}
}

// vocabSpelling is how the test tokenizer's vocabulary spells token id.
func vocabSpelling(id int32) string {
	if id < 256 {
		return byteLevel(string([]byte{byte(id)}))
	}
	m := gpt2Merges[id-256]
	return byteLevel(m[0] + m[1])
}

// TestGenerateSampling: above temperature 0 a seed gives the same text
// every run, and other seeds other texts.
func TestGenerateSampling(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hf")
	writeHFEvalModel(t, hf, evalTorchShapes[1], 8, dtype.F32, testTokenizer{merges: gpt2Merges})
	gen := func(seed string) string {
		out, errOut, err := runApp(t, "generate", "--model", hf, "--prompt", "The cat", "--max-new-tokens", "16", "--temperature", "1", "--seed", seed)
		if err != nil {
			t.Fatalf("generate --seed %s: %v\n%s", seed, err, errOut)
		}
		return out
	}
	a, b := gen("7"), gen("7")
	if a != b {
		t.Errorf("seed 7 gave %q, then %q", a, b)
	}
	if c, d := gen("8"), gen("9"); a == c && a == d {
		t.Errorf("seeds 7, 8 and 9 gave the same text %q", a)
	}
}

// TestSampleToken: greedy takes the first of the largest logits; sampled
// frequencies follow softmax(logits / T): with logits (0, ln 3) the second
// token has probability 3/4 at T = 1 and 9/10 at T = 1/2. 20000 seeded
// draws have a standard deviation of 0.003 or less; the tolerance is 0.015.
func TestSampleToken(t *testing.T) {
	if got := infer.SampleToken([]float32{1, 3, 3, 2}, 0, nil); got != 1 {
		t.Errorf("greedy picked %d, want 1 (the first of the largest)", got)
	}
	logits := []float32{0, float32(math.Log(3))}
	for _, c := range []struct{ temp, want float64 }{{1, 0.75}, {0.5, 0.9}} {
		rng := rand.New(rand.NewPCG(1, 2))
		n := 0
		for range 20000 {
			if infer.SampleToken(logits, c.temp, rng) == 1 {
				n++
			}
		}
		if f := float64(n) / 20000; math.Abs(f-c.want) > 0.015 {
			t.Errorf("temperature %v: token 1 drawn %.4f of the time, want %.2f", c.temp, f, c.want)
		}
	}
}

// TestPromptIDs: the template's tokens before the text go before the
// prompt, those after it do not; --no-special leaves both out.
func TestPromptIDs(t *testing.T) {
	dir := t.TempDir()
	tt := testTokenizer{merges: gpt2Merges, special: []string{"<s>", "</s>"}, postProcessor: `{"type": "TemplateProcessing",
		"single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
		"pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [266], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [267], "tokens": ["</s>"]}}}`}
	tt.write(t, dir)
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	plain := tok.Encode("the cat", false)
	if got, want := infer.PromptIDs(tok, "the cat", true), append([]int32{266}, plain...); !slices.Equal(got, want) {
		t.Errorf("with the template: %v, want %v", got, want)
	}
	if got := infer.PromptIDs(tok, "the cat", false); !slices.Equal(got, plain) {
		t.Errorf("--no-special: %v, want %v", got, plain)
	}
	if got := infer.PromptIDs(tok, "", true); !slices.Equal(got, []int32{266}) {
		t.Errorf("empty prompt: %v, want [266]", got)
	}
}

// TestGenerateRefuses: bad flags and a prompt that fills the model's
// context are refused, naming what is wrong.
func TestGenerateRefuses(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hf")
	writeHFEvalModel(t, hf, evalTorchShapes[0], 8, dtype.F32, testTokenizer{merges: gpt2Merges})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "x", "--max-new-tokens", "0"}, "--max-new-tokens 0"},
		{[]string{"--prompt", "x", "--temperature", "-1"}, "--temperature -1"},
		{[]string{"--prompt", ""}, "--prompt is empty"},
		{[]string{"--prompt", strings.Repeat("x", 64)}, "max_seq_len is 64"},
		{[]string{"--prompt", "x", "--backend", "tpu"}, `--backend "tpu"`},
	} {
		_, _, err := runApp(t, append([]string{"generate", "--model", hf}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("generate %v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// TestGenerateHugeMaxNew: --max-new-tokens at the largest int
// (9223372036854775807; the prompt's length added to it overflowed into
// "decoder capacity -9223372036854775804") generates up to the model's
// max_seq_len and says so.
func TestGenerateHugeMaxNew(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hf")
	writeHFEvalModel(t, hf, evalTorchShapes[0], 8, dtype.F32, testTokenizer{merges: gpt2Merges})
	for _, n := range []string{"9223372036854775807", "9223372036854775000", "1000"} {
		_, stderr, err := runApp(t, "generate", "--model", hf, "--prompt", "The cat", "--max-new-tokens", n)
		if err != nil {
			t.Fatalf("--max-new-tokens %s: %v\n%s", n, err, stderr)
		}
		if !strings.Contains(stderr, "stopped at the model's max_seq_len") && !strings.Contains(stderr, "stopped at EOS") {
			t.Errorf("--max-new-tokens %s: %s", n, stderr)
		}
	}
}

// TestGenerateMessagesBOM: a --messages file that starts with a UTF-8 byte
// order mark (as Windows editors save JSON) reads as the same
// conversation: the same prompt and the same text as without it.
func TestGenerateMessagesBOM(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hf")
	writeHFEvalModel(t, hf, evalTorchShapes[0], 8, dtype.F32, testTokenizer{merges: gpt2Merges})
	tmpl := writeFile(t, "t.jinja", "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")
	const msgs = `[{"role": "user", "content": "The cat"}]`
	var outs, errs []string
	for _, content := range []string{msgs, "\xef\xbb\xbf" + msgs} {
		f := writeFile(t, "m.json", content)
		out, stderr, err := runApp(t, "generate", "--model", hf, "--messages", f, "--chat-template", tmpl, "--max-new-tokens", "4")
		if err != nil {
			t.Fatalf("--messages %q: %v\n%s", content[:8], err, stderr)
		}
		line := stderr[strings.Index(stderr, "chat template:"):]
		outs, errs = append(outs, out), append(errs, line[:strings.Index(line, "\n")])
	}
	if outs[0] != outs[1] || errs[0] != errs[1] {
		t.Errorf("with a BOM: %q\n%s\nwithout: %q\n%s", outs[1], errs[1], outs[0], errs[0])
	}
}
