package cmd

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/internal/hosttest"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
	"github.com/strata-ai/strata/tokenizer"
)

// hfReference is the independent PyTorch transcription of the three
// architectures (model/testdata), run by hosttest.TorchPython.
const hfReference = "../model/testdata/hf_reference.py"

// byteLevelRune is GPT-2's bytes_to_unicode, written again here: the 188
// printable bytes stand for themselves, the others are U+0100 onward in
// byte order.
func byteLevelRune(b byte) rune {
	printable := func(c int) bool {
		return ('!' <= c && c <= '~') || (0xA1 <= c && c <= 0xAC) || (0xAE <= c && c <= 0xFF)
	}
	if printable(int(b)) {
		return rune(b)
	}
	n := rune(256)
	for c := 0; c < int(b); c++ {
		if !printable(c) {
			n++
		}
	}
	return n
}

func byteLevel(raw string) string {
	var out []rune
	for i := 0; i < len(raw); i++ {
		out = append(out, byteLevelRune(raw[i]))
	}
	return string(out)
}

// testTokenizer is a small byte-level BPE tokenizer.json: ids 0-255 the
// bytes in byte order, then one token per merge (raw byte strings), then
// the special tokens; tokenizer_config.json names the first special token
// as BOS and EOS, as GPT-2's does. preTokenizer is its JSON ("" is GPT-2's
// ByteLevel with its regex).
type testTokenizer struct {
	merges       [][2]string
	special      []string
	preTokenizer string
	// postProcessor is its JSON; "" is GPT-2's ByteLevel (no template).
	postProcessor string
}

// gpt2Merges make common English pieces whole tokens.
var gpt2Merges = [][2]string{{" ", "t"}, {"h", "e"}, {" t", "he"}, {" ", "a"}, {"i", "n"}, {"e", "r"}, {" ", "s"}, {"o", "n"}, {"a", "t"}, {"r", "e"}}

func (tt testTokenizer) vocabSize() int { return 256 + len(tt.merges) + len(tt.special) }

func (tt testTokenizer) write(t *testing.T, dir string) {
	t.Helper()
	vocab := map[string]int{}
	for b := range 256 {
		vocab[byteLevel(string([]byte{byte(b)}))] = b
	}
	var merges []string
	for _, m := range tt.merges {
		vocab[byteLevel(m[0]+m[1])] = len(vocab)
		merges = append(merges, byteLevel(m[0])+" "+byteLevel(m[1]))
	}
	var added []map[string]any
	for _, sp := range tt.special {
		added = append(added, map[string]any{"id": len(vocab), "content": sp, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
		vocab[sp] = len(vocab)
	}
	pre := tt.preTokenizer
	if pre == "" {
		pre = `{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}`
	}
	mdl, err := json.Marshal(map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "",
		"end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges})
	if err != nil {
		t.Fatal(err)
	}
	addedJSON, _ := json.Marshal(added)
	if added == nil {
		addedJSON = []byte("[]")
	}
	post := tt.postProcessor
	if post == "" {
		post = `{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}`
	}
	f := `{"version": "1.0", "truncation": null, "padding": null, "added_tokens": ` + string(addedJSON) + `,
		"normalizer": null, "pre_tokenizer": ` + pre + `,
		"post_processor": ` + post + `,
		"decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": ` + string(mdl) + `}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(f), 0o644); err != nil {
		t.Fatal(err)
	}
	if len(tt.special) > 0 {
		cfg := `{"bos_token": "` + tt.special[0] + `", "eos_token": "` + tt.special[0] + `"}`
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// writeHFEvalModel writes a Hugging Face directory of shape s (its Vocab
// the tokenizer's) at dir: the seeded initialisation of seed plus N(0,
// 0.1) noise (so that the model is far from uniform), in dt, with tt's
// tokenizer files.
func writeHFEvalModel(t *testing.T, dir string, s model.Shape, seed uint64, dt dtype.DType, tt testTokenizer) [][]float32 {
	t.Helper()
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	chunks := l.Init(seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	for _, ch := range chunks {
		for i := range ch {
			ch[i] += float32(0.1 * rng.NormFloat64())
		}
	}
	_, err = hf.ExportDir(dir, l, hf.DirOptions{DType: dt}, func(w *hf.ExportWriter) error {
		for c := range chunks {
			if err := w.F32(c, chunks[c]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tt.write(t, dir)
	return chunks
}

// evalText is varied text: English, code, digits, whitespace runs,
// Unicode.
const evalText = "The cat sat on the mat, and the dog ate the rest of the bread. In 2024 there were 1234567 of them!\n" +
	"func main() {\n\tfmt.Println(\"héllo, wörld\") // naïve café\n}\n\n   Indented   text\twith\ttabs.  " +
	"日本語のテキスト and emoji 🙂 then the end. Then: the theory, the threat, the rest is there."

// evalJSON runs strata eval with --json and returns its result.
func evalJSON(t *testing.T, args ...string) (evalResult, string) {
	t.Helper()
	out, errOut, err := runApp(t, append([]string{"eval", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("eval %v: %v\n%s\n%s", args, err, out, errOut)
	}
	var r evalResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("eval --json printed %q: %v", out, err)
	}
	return r, errOut
}

// readF32s reads a file of little-endian float32 values.
func readF32s(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// maxRelErr is max|got-want| / max|want|.
func maxRelErr(got, want []float32) float64 {
	var d, m float64
	for i := range want {
		d = math.Max(d, math.Abs(float64(got[i])-float64(want[i])))
		m = math.Max(m, math.Abs(float64(want[i])))
	}
	return d / m
}

// evalTorchShapes are the architectures of the reference check: GPT-2,
// Llama with grouped-query attention and an untied head, Qwen2 with
// biases, one key/value head and a tied head; vocabulary 256 bytes + 10
// merges + 1 special token.
var evalTorchShapes = []model.Shape{
	{Name: "gpt2-eval", Layers: 2, Dim: 32, Heads: 4, Vocab: 267, MaxSeq: 64},
	{Name: "llama-eval", Layers: 2, Dim: 32, Heads: 4, Vocab: 267, MaxSeq: 64, Arch: model.ArchLlama, KVHeads: 2, FFN: 48, RopeTheta: 10000},
	{Name: "qwen2-eval", Layers: 2, Dim: 32, Heads: 4, Vocab: 267, MaxSeq: 64, Arch: model.ArchQwen2, KVHeads: 1, FFN: 48, RopeTheta: 1e6, NormEps: 1e-6, TieEmbeddings: true},
}

// TestEvalAgainstTorch writes tiny random GPT-2, Llama and Qwen2 models in
// Hugging Face layout with a byte-level BPE tokenizer.json, runs strata
// eval --seq 16 --logits on a text whose tokens end in a shorter window,
// and hf_reference.py (PyTorch, sharing nothing with Strata) on the same
// windows: every predicted token's logits and the mean loss agree within
// 1e-4 relative (both sides fp32: sums of at most 48 terms of ~1e-7
// relative error each, two blocks deep; a wrong window cut, position or
// target is off by more than 1e-2), the token count is the file's tokens
// less one, and ppl = exp(loss). The Llama model is also evaluated from
// BF16 files: Strata then holds bf16 params (the same values, widened
// exactly, that the reference reads) with fp32 activations, and the same
// tolerance holds.
func TestEvalAgainstTorch(t *testing.T) {
	hosttest.RequireTorch(t)
	script, err := filepath.Abs(hfReference)
	if err != nil {
		t.Fatal(err)
	}
	tt := testTokenizer{merges: gpt2Merges, special: []string{"<|endoftext|>"}}
	type evalCase struct {
		s  model.Shape
		dt dtype.DType
	}
	cases := []evalCase{{evalTorchShapes[0], dtype.F32}, {evalTorchShapes[1], dtype.F32}, {evalTorchShapes[2], dtype.F32}, {evalTorchShapes[1], dtype.BF16}}
	for i, c := range cases {
		t.Run(c.s.ArchName()+"-"+c.dt.String(), func(t *testing.T) {
			const seq = 16
			dir := t.TempDir()
			hf := filepath.Join(dir, "hf")
			writeHFEvalModel(t, hf, c.s, uint64(20+i), c.dt, tt)
			data := filepath.Join(dir, "text.txt")
			if err := os.WriteFile(data, []byte(evalText), 0o644); err != nil {
				t.Fatal(err)
			}
			logitsPath := filepath.Join(dir, "logits.f32")
			r, errOut := evalJSON(t, "--model", hf, "--data", data, "--seq", "16", "--logits", logitsPath)
			wantDT := map[dtype.DType]string{dtype.F32: "params f32 (the weights are stored in F32)", dtype.BF16: "params bf16 (the weights are stored in BF16)"}[c.dt]
			if !strings.Contains(errOut, wantDT) {
				t.Errorf("stderr does not say %q:\n%s", wantDT, errOut)
			}

			tok, err := tokenizer.Load(filepath.Join(hf, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			ids := tok.Encode(evalText, false)
			if (len(ids)-1)%seq == 0 {
				t.Fatalf("%d tokens: the last window is not shorter", len(ids))
			}
			// The windows as rows, the last padded with ignored targets.
			var rows, targets [][]int32
			for s := 0; s+1 < len(ids); s += seq {
				n := min(seq, len(ids)-1-s)
				row, tg := make([]int32, seq), make([]int32, seq)
				for j := range seq {
					tg[j] = -1
					if j < n {
						row[j], tg[j] = ids[s+j], ids[s+j+1]
					}
				}
				rows, targets = append(rows, row), append(targets, tg)
			}
			batch, _ := json.Marshal(map[string]any{"ids": rows, "targets": targets})
			batchPath, refPath := filepath.Join(dir, "batch.json"), filepath.Join(dir, "ref.safetensors")
			if err := os.WriteFile(batchPath, batch, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(hosttest.TorchPython, script, hf, batchPath, refPath).CombinedOutput(); err != nil {
				t.Fatalf("hf_reference.py: %v\n%s", err, out)
			}
			_, tensors, err := safetensors.ReadFile(refPath)
			if err != nil {
				t.Fatal(err)
			}
			refLogits, refLoss := f32s(tensors["logits"]), f32s(tensors["loss"])[0]
			var want []float32
			for w, tg := range targets {
				for j := range seq {
					if tg[j] >= 0 {
						want = append(want, refLogits[(w*seq+j)*c.s.Vocab:(w*seq+j+1)*c.s.Vocab]...)
					}
				}
			}
			got := readF32s(t, logitsPath)
			if len(got) != len(want) {
				t.Fatalf("--logits holds %d values, the reference %d", len(got), len(want))
			}
			logitErr := maxRelErr(got, want)
			lossErr := math.Abs(r.Loss-float64(refLoss)) / float64(refLoss)
			if !(logitErr <= 1e-4) || !(lossErr <= 1e-4) {
				t.Errorf("logits off by %.3g relative, loss %.7g vs %.7g (%.3g relative): tolerance 1e-4", logitErr, r.Loss, refLoss, lossErr)
			}
			if r.Tokens != int64(len(ids)-1) || r.Windows != int64(len(rows)) || r.PPL != math.Exp(r.Loss) {
				t.Errorf("tokens %d windows %d ppl %v, want %d, %d, exp(%v)", r.Tokens, r.Windows, r.PPL, len(ids)-1, len(rows), r.Loss)
			}
			t.Logf("%s %s: %d tokens in %d windows; loss %.6f (reference %.6f); max relative error: logits %.2e, loss %.2e",
				c.s.ArchName(), c.dt, r.Tokens, r.Windows, r.Loss, refLoss, logitErr, lossErr)
		})
	}
}

// f32s reads the bytes of an F32 tensor.
func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// TestEvalInitLowersLoss is issue 13's "train --init lowers the loss",
// end to end: a tiny GPT-2 in Hugging Face layout (its tokenizer.json maps
// each byte to its own id, so train's byte data and eval's tokens are the
// same ids), fine-tuned on a text by strata train --init, evaluates on
// that text with a lower loss from the run directory than from the
// Hugging Face directory; the run directory's tokenizer is the one its
// run recorded.
func TestEvalInitLowersLoss(t *testing.T) {
	dir := t.TempDir()
	hf := filepath.Join(dir, "hf")
	s := model.Shape{Arch: model.ArchGPT2, Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 64}
	writeHFEvalModel(t, hf, s, 5, dtype.F32, testTokenizer{})
	data := filepath.Join(dir, "text.txt")
	text := strings.Repeat("The cat sat on the mat. The dog ate the bread. ", 40)
	if err := os.WriteFile(data, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "cfg.json", `{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 1},
  "strata": {"devices": 1, "seq_len": 32}
}`)
	run := filepath.Join(dir, "run")
	if out, errOut, err := runApp(t, "train", "--init", hf, "--config", cfg, "--data", data, "--steps", "30", "--out", run, "--save-every", "30", "--no-progress"); err != nil {
		t.Fatalf("train --init: %v\n%s\n%s", err, out, errOut)
	}
	before, _ := evalJSON(t, "--model", hf, "--data", data, "--seq", "64")
	after, errOut := evalJSON(t, "--model", run, "--data", data, "--seq", "64")
	if !strings.Contains(errOut, "tokenizer "+filepath.Join(hf, "tokenizer.json")) {
		t.Errorf("eval of the run directory does not use the tokenizer its run recorded:\n%s", errOut)
	}
	if !strings.Contains(errOut, "params f32 (the checkpoint's fp32 master weights)") {
		t.Errorf("eval of the run directory does not evaluate the master weights in fp32:\n%s", errOut)
	}
	if after.Tokens != before.Tokens || after.Tokens != int64(len(text)-1) {
		t.Errorf("tokens %d and %d, want %d", before.Tokens, after.Tokens, len(text)-1)
	}
	if !(after.Loss < before.Loss-0.5) {
		t.Errorf("loss %.4f after 30 steps of --init, %.4f before: want it lower by more than 0.5", after.Loss, before.Loss)
	}
	t.Logf("loss on the training text: %.4f from the Hugging Face directory, %.4f after 30 steps", before.Loss, after.Loss)
}

// TestTokenStreamSameIDs: the file tokenized a block at a time gives the
// ids of the whole file, for GPT-2's ByteLevel regex (with and without
// add_prefix_space), a Llama-3 Split pattern and the byte tokenizer, with
// blocks far smaller than the text (every cut is exercised), and a text
// without any cut (one block past MaxBlockBytes) still gives every
// byte's token.
func TestTokenStreamSameIDs(t *testing.T) {
	dir := t.TempDir()
	text := strings.Repeat(evalText, 3) + "  trailing spaces   \n\n"
	data := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(data, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	llama3 := `{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}`
	toks := map[string]*tokenizer.Tokenizer{"bytes": tokenizer.Bytes()}
	for name, pre := range map[string]string{
		"gpt2":          "",
		"gpt2 prefixed": `{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}`,
		"llama3":        llama3,
	} {
		d := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		testTokenizer{merges: gpt2Merges, preTokenizer: pre}.write(t, d)
		tok, err := tokenizer.Load(filepath.Join(d, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		toks[name] = tok
	}
	for name, tok := range toks {
		want := tok.Encode(text, false)
		for _, block := range []int{1, 7, 64, 1 << 20} {
			ts, err := infer.OpenTokenStream(data, tok)
			if err != nil {
				t.Fatal(err)
			}
			ts.BlockBytes = block
			var got []int32
			blocks := 0
			for {
				ids, err := ts.Next()
				if err != nil {
					t.Fatal(err)
				}
				if ids == nil {
					break
				}
				got, blocks = append(got, ids...), blocks+1
			}
			ts.Close()
			if !slices.Equal(got, want) {
				t.Errorf("%s, blocks of %d bytes: %d ids in %d blocks differ from the whole text's %d", name, block, len(got), blocks, len(want))
			}
			if block == 7 && blocks < 10 {
				t.Errorf("%s: blocks of 7 bytes gave %d blocks: the cuts are not exercised", name, blocks)
			}
		}
	}
	// No cut anywhere: blocks are cut at MaxBlockBytes.
	noSpace := filepath.Join(dir, "nospace.txt")
	raw := strings.Repeat("日本語", 30)
	if err := os.WriteFile(noSpace, []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	ts, err := infer.OpenTokenStream(noSpace, tokenizer.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	ts.BlockBytes, ts.MaxBlockBytes = 5, 16
	n := 0
	for {
		ids, err := ts.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ids == nil {
			break
		}
		n += len(ids)
	}
	if n != len(raw) || !utf8.ValidString(raw) {
		t.Errorf("%d byte tokens from %d bytes without a cut", n, len(raw))
	}
}

// TestEvalRefuses: a model larger than the device's memory, a window
// past max_seq_len, a file of one token, and a model without a tokenizer
// whose vocabulary is not bytes are refused, each naming what is wrong.
func TestEvalRefuses(t *testing.T) {
	dir := t.TempDir()
	hf := filepath.Join(dir, "hf")
	writeHFEvalModel(t, hf, evalTorchShapes[1], 3, dtype.F32, testTokenizer{merges: gpt2Merges, special: []string{"<|endoftext|>"}})
	data := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(data, []byte(evalText), 0o644); err != nil {
		t.Fatal(err)
	}
	one := filepath.Join(dir, "one.txt")
	if err := os.WriteFile(one, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	noTok := filepath.Join(dir, "notok")
	writeHFEvalModel(t, noTok, evalTorchShapes[1], 3, dtype.F32, testTokenizer{})
	os.Remove(filepath.Join(noTok, "tokenizer.json"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", hf, "--data", data, "--hbm", "64KiB"}, "stream the weights through host RAM or NVMe with --offload cpu or --offload nvme --nvme-path DIR"},
		{[]string{"--model", hf, "--data", data, "--seq", "65"}, "past the model's max_seq_len 64"},
		{[]string{"--model", hf, "--data", one}, "nothing to predict"},
		{[]string{"--model", noTok, "--data", data}, "has no tokenizer.json"},
		{[]string{"--model", filepath.Join(dir, "missing"), "--data", data}, "eval: --model"},
		{[]string{"--model", hf, "--data", filepath.Join(dir, "missing.txt")}, "eval: --data"},
		{[]string{"--model", hf, "--data", data, "--dtype", "fp16"}, "--dtype \"fp16\""},
	} {
		_, _, err := runApp(t, append([]string{"eval"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("eval %v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	_, _, err := runApp(t, "eval", "--model", hf, "--data", data, "--hbm", "64KiB")
	if err != nil && !strings.Contains(err.Error(), "the model needs") {
		t.Errorf("the refusal does not say what the model needs: %v", err)
	}
}

// TestEvalSeededRunAndBOS: a run trained from the seeded initialisation
// (no source, vocabulary 256) is evaluated with the byte tokenizer, one
// token per byte; --bos puts the tokenizer's BOS first, so every token of
// the file is predicted, and is refused for a tokenizer without one.
func TestEvalSeededRunAndBOS(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if out, errOut, err := runApp(t, trainArgs(tinyConfig(t), "--steps", "2", "--out", run, "--save-every", "2")...); err != nil {
		t.Fatalf("train: %v\n%s\n%s", err, out, errOut)
	}
	data := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(data, []byte(evalText), 0o644); err != nil {
		t.Fatal(err)
	}
	r, errOut := evalJSON(t, "--model", run, "--data", data, "--seq", "32")
	if !strings.Contains(errOut, "tokenizer bytes") || r.Tokens != int64(len(evalText)-1) {
		t.Errorf("%d tokens (want %d, one per byte less the first), stderr:\n%s", r.Tokens, len(evalText)-1, errOut)
	}
	if _, _, err := runApp(t, "eval", "--model", run, "--data", data, "--bos"); err == nil || !strings.Contains(err.Error(), "names no BOS") {
		t.Errorf("--bos with the byte tokenizer: %v", err)
	}
	hf := filepath.Join(dir, "hf")
	writeHFEvalModel(t, hf, evalTorchShapes[0], 4, dtype.F32, testTokenizer{merges: gpt2Merges, special: []string{"<|endoftext|>"}})
	plain, _ := evalJSON(t, "--model", hf, "--data", data)
	bos, _ := evalJSON(t, "--model", hf, "--data", data, "--bos")
	if bos.Tokens != plain.Tokens+1 {
		t.Errorf("--bos: %d tokens predicted, without %d: want one more", bos.Tokens, plain.Tokens)
	}
}

// TestEvalJSONLAsTraining: `strata eval --data chat.jsonl` scores the file
// as `strata train --eval-data chat.jsonl` does: the same tokens (the
// completions' and the assistant's turns', 467 here, where eval counted
// every byte of the JSON, 2,268) and the same loss for the same weights (the
// run's checkpoint, and its export as a Hugging Face directory, evaluated
// in bf16 as the engine holds its params; the engine's activations are
// bf16, the decoder's fp32: within 0.1%; measured 7e-5). A --bos with JSONL is refused.
func TestEvalJSONLAsTraining(t *testing.T) {
	train := writeFile(t, "chat.jsonl", chatJSONL(200, 1))
	held := writeFile(t, "held.jsonl", chatJSONL(20, 2))
	cfg := writeFile(t, "chat.json", strings.Replace(chatConfig, `"seq_len": 128`, `"seq_len": 64`, 1))
	run := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--data", train, "--eval-data", held, "--steps", "20", "--save-every", "20", "--out", run); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var sum struct {
		Loss   float64 `json:"eval_loss"`
		Tokens int64   `json:"eval_tokens"`
	}
	b, _ := os.ReadFile(filepath.Join(run, "summary.json"))
	if err := json.Unmarshal(b, &sum); err != nil || sum.Tokens == 0 {
		t.Fatalf("summary.json: %v: %s", err, b)
	}
	hfDir := filepath.Join(t.TempDir(), "hf")
	if _, stderr, err := runApp(t, "export", "--format", "hf", "--dtype", "fp32", run, hfDir); err != nil {
		t.Fatalf("export: %v\n%s", err, stderr)
	}
	for _, m := range []string{run, hfDir} {
		r, stderr := evalJSON(t, "--model", m, "--data", held, "--seq", "64", "--dtype", "bf16")
		if r.Tokens != sum.Tokens || math.Abs(r.Loss-sum.Loss) > 1e-3*sum.Loss {
			t.Errorf("eval --model %s: loss %.4f over %d tokens; train --eval-data: %.4f over %d\n%s", m, r.Loss, r.Tokens, sum.Loss, sum.Tokens, stderr)
		}
		t.Logf("eval --model %s: loss %.5f over %d tokens; train --eval-data: %.5f over %d", m, r.Loss, r.Tokens, sum.Loss, sum.Tokens)
	}
	_, _, err := runApp(t, "eval", "--model", run, "--data", held, "--bos")
	if err == nil || !strings.Contains(err.Error(), "is JSONL") || exitCode(err) != 2 {
		t.Errorf("eval --bos on JSONL: %v", err)
	}
}

// TestEvalJSONLChatTemplate: a Hugging Face model's own tokenizer and chat
// template (tokenizer_config.json's, whose eos_token ends each turn) are
// the ones eval reads a JSONL file with, as train --init does: the same
// tokens and loss as train --eval-data on the model's unchanged weights
// (lr 0), where ChatML (--chat-template of a .jinja) counts other tokens.
func TestEvalJSONLChatTemplate(t *testing.T) {
	dir := t.TempDir()
	hfDir := filepath.Join(dir, "model")
	shape := initShape
	shape.Vocab = 264
	writeHFModel(t, hfDir, shape, 11)
	files := map[string]string{
		"tokenizer.json": byteLevelTokenizerJSON(),
		"tokenizer_config.json": `{"eos_token": "<|im_end|>", "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}: {{ m.content }}<|im_end|>{% endfor %}` +
			`{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}"}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(hfDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	held := writeFile(t, "held.jsonl", chatJSONL(12, 3))
	cfg := writeFile(t, "cfg.json", fmt.Sprintf(frozenConfig, ""))
	run := filepath.Join(dir, "run")
	if _, stderr, err := runApp(t, "train", "--init", hfDir, "--config", cfg, "--eval-data", held, "--steps", "1", "--out", run); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var sum struct {
		Loss   float64 `json:"eval_loss"`
		Tokens int64   `json:"eval_tokens"`
	}
	b, _ := os.ReadFile(filepath.Join(run, "summary.json"))
	if err := json.Unmarshal(b, &sum); err != nil || sum.Tokens == 0 {
		t.Fatalf("summary.json: %v: %s", err, b)
	}
	r, stderr := evalJSON(t, "--model", hfDir, "--data", held, "--seq", "32", "--dtype", "bf16")
	if r.Tokens != sum.Tokens || math.Abs(r.Loss-sum.Loss) > 1e-3*sum.Loss {
		t.Errorf("eval: loss %.5f over %d tokens; train --eval-data: %.5f over %d\n%s", r.Loss, r.Tokens, sum.Loss, sum.Tokens, stderr)
	}
	if !strings.Contains(stderr, "chat template: ") || strings.Contains(stderr, "chat template: default (ChatML)") {
		t.Errorf("eval does not name the model's chat template:\n%s", stderr)
	}
	chatml := writeFile(t, "chatml.jinja", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
	if r2, _ := evalJSON(t, "--model", hfDir, "--data", held, "--seq", "32", "--chat-template", chatml); r2.Tokens == r.Tokens {
		t.Errorf("--chat-template %s counts %d tokens, as the model's template does", chatml, r2.Tokens)
	}
	t.Logf("eval: loss %.5f over %d tokens; train --eval-data: %.5f over %d", r.Loss, r.Tokens, sum.Loss, sum.Tokens)
}
