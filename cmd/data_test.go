package cmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/hosttest"
	"github.com/strata-ai/strata/model"
)

// dataConfig is a small run (tiny model, ZeRO-3 on 2 devices, the
// optimizer on the host) for the --data tests.
const dataConfig = `{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "seed": 5}
}`

// TestTrainDataStreamed: `strata train --data FILE` (the file read in
// windows) ends bit-identical to the same run on the same bytes held in
// memory, the way --data read them before: every step's loss and the
// written model.safetensors.
func TestTrainDataStreamed(t *testing.T) {
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	data := writeFile(t, "corpus.txt", string(text))
	cfgPath := writeFile(t, "data.json", dataConfig)
	dir := t.TempDir()
	const steps = 6
	if _, stderr, err := runApp(t, "train", "--config", cfgPath, "--data", data, "--steps", strconv.Itoa(steps), "--out", dir, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}

	// The same run, its corpus in memory (model.Tokens as engine.Options.Corpus).
	cfg, err := config.Load(filepath.Join(dir, "config.json"), config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		t.Fatal(err)
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: cfg.Strata.Devices, HBMBytes: cfg.Strata.HBMBytes})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, cpu.Devices(devs), comms, engine.Options{Corpus: model.Tokens(model.Encode(text))})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	want := map[int64]float64{}
	if err := e.Run(t.Context(), steps, func(st report.StepStats) error { want[st.Step] = st.Loss; return nil }); err != nil {
		t.Fatal(err)
	}
	sameLosses(t, "--data streamed", stepLosses(t, dir), want, 1, steps)
	memDir := t.TempDir()
	if err := writeRunOut(memDir, e, e.Summary(), 0, nil, stepTime{}, io.Discard); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if mem, _ := os.ReadFile(filepath.Join(memDir, "model.safetensors")); !bytes.Equal(got, mem) {
		t.Error("model.safetensors of the streamed run differs from the in-memory run's")
	}
}

// TestTrainDataRSS: a 4 GiB data file (sparse, with text at scattered
// offsets) trains 3 steps in a child process whose peak RSS stays within
// that of the same run on a 64 MiB file + 32 MiB: memory does not grow
// with the file. The parent samples the child's RSS and kills it past the
// bound, so a corpus read whole fails here without filling the machine.
func TestTrainDataRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two training processes and a 4 GiB sparse file")
	}
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgPath := writeFile(t, "data.json", dataConfig)
	small := filepath.Join(dir, "small.txt")
	f, err := os.Create(small)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat(text, (1<<20)/len(text)+1)[:1<<20]
	for range 64 {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	large := filepath.Join(dir, "large.txt")
	if f, err = os.Create(large); err != nil {
		t.Fatal(err)
	}
	const largeBytes = 4 << 30
	if err := f.Truncate(largeBytes); err != nil {
		t.Fatal(err)
	}
	// Text in the first 64 KiB: a NUL there is a binary file (data.ErrBinary).
	if _, err := f.WriteAt(chunk[:64<<10], 0); err != nil {
		t.Fatal(err)
	}
	for i := range int64(64) {
		if _, err := f.WriteAt(text, i*(largeBytes/64)+i*4099); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	// The children's garbage collector is held to 32 MiB of Go memory:
	// on a loaded machine its lag lets garbage pile up by tens of MiB,
	// which is not what this measures (memory kept past the limit still
	// shows, and a run holding the file could not stay under it).
	t.Setenv("GOMEMLIMIT", "32MiB")
	const slackBytes = 32 << 20
	base := childPeakRSS(t, 0, "train", "--config", cfgPath, "--data", small, "--steps", "3", "--no-progress")
	bound := base + slackBytes
	peak := childPeakRSS(t, bound, "train", "--config", cfgPath, "--data", large, "--steps", "3", "--no-progress")
	t.Logf("peak RSS: %d MiB on a 64 MiB file, %d MiB on a 4 GiB file (bound %d MiB)", base>>20, peak>>20, bound>>20)
	if peak > bound {
		t.Errorf("peak RSS %d MiB on a 4 GiB file, over %d MiB (the 64 MiB file's %d MiB + %d MiB): memory grows with the file",
			peak>>20, bound>>20, base>>20, slackBytes>>20)
	}
}

// childPeakRSS runs `strata args...` in a child process and returns its
// peak RSS in bytes: the largest VmHWM read from /proc every 10 ms (not
// getrusage's maxrss, which on Linux also counts the test process's own
// peak: the child is exec'd from a vfork that shares its memory). With
// bound > 0 it kills the child once its RSS is above bound, returning
// that sample.
func childPeakRSS(t *testing.T, bound int64, args ...string) int64 {
	t.Helper()
	c := startChild(t, "", "", args...)
	done := make(chan int, 1)
	go func() { done <- c.wait() }()
	var over, peak int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case code := <-done:
			if over > 0 {
				return over
			}
			if code != 0 {
				t.Fatalf("strata %s: exit status %d\n%s", strings.Join(args, " "), code, c.stderr.String())
			}
			return peak
		case <-tick.C:
			rss, hwm := hosttest.ProcRSS(c.cmd.Process.Pid)
			peak = max(peak, hwm)
			if bound > 0 && rss > bound && over == 0 {
				over = rss
				c.cmd.Process.Kill()
			}
		}
	}
}

// chatConfig is a small run for the chat tests: the small model (max_seq
// 256), rows of 128, ZeRO-3 on 2 devices with the optimizer on the host.
const chatConfig = `{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "small", "devices": 2, "seq_len": 128, "seed": 5}
}`

// chatJSONL is n generated conversations (from seed): a question about
// the sum of two digits or a colour, and the assistant's answer in a fixed
// form; some with a system message, some as prompt/completion lines.
func chatJSONL(n int, seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 9))
	things := []string{"grass", "the sky", "snow", "coal", "a lemon", "blood"}
	thingColour := []string{"green", "blue", "white", "black", "yellow", "red"}
	var b strings.Builder
	for i := range n {
		var q, a string
		if rng.IntN(2) == 0 {
			x, y := rng.IntN(10), rng.IntN(10)
			q, a = fmt.Sprintf("What is %d plus %d?", x, y), fmt.Sprintf("%d plus %d is %d.", x, y, x+y)
		} else {
			k := rng.IntN(len(things))
			q, a = fmt.Sprintf("What colour is %s?", things[k]), fmt.Sprintf("%s is %s.", strings.ToUpper(things[k][:1])+things[k][1:], thingColour[k])
		}
		var rec any
		switch i % 5 {
		case 0:
			rec = map[string]any{"messages": []any{map[string]string{"role": "system", "content": "Answer in one sentence."},
				map[string]string{"role": "user", "content": q}, map[string]string{"role": "assistant", "content": a}}}
		case 1:
			rec = map[string]string{"prompt": q + "\n", "completion": a}
		default:
			rec = map[string]any{"messages": []any{map[string]string{"role": "user", "content": q}, map[string]string{"role": "assistant", "content": a}}}
		}
		line, _ := json.Marshal(rec)
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// stepLines reads steps.jsonl of a run directory as maps.
func stepLines(t *testing.T, dir string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestTrainChatEvalLoss: `strata train --data chat.jsonl --eval-data
// held.jsonl` (generated conversations and prompt/completion lines, the
// small byte-level model, ChatML) lowers the held-out loss: evaluated
// every 10 steps and at the end, written to steps.jsonl (eval_loss,
// eval_tokens on the lines of those steps only) and summary.json, and
// printed. Needs the model side of Batch.Pos and model.IgnoreTarget.
func TestTrainChatEvalLoss(t *testing.T) {
	train := writeFile(t, "chat.jsonl", chatJSONL(600, 1))
	held := writeFile(t, "held.jsonl", chatJSONL(60, 2))
	cfg := writeFile(t, "chat.json", chatConfig)
	dir := t.TempDir()
	stdout, stderr, err := runApp(t, "train", "--config", cfg, "--data", train, "--eval-data", held, "--eval-every", "10", "--steps", "30", "--out", dir, "--no-progress")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"data: " + train + ", jsonl, 600 examples (0 text, 120 prompt/completion, 480 chat)", "chat template: default (ChatML)", "eval after step 10: loss", "eval after step 30: loss"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
	if !strings.Contains(stdout, "eval loss ") {
		t.Errorf("stdout has no eval summary:\n%s", stdout)
	}
	var evals []float64
	var tokens float64
	for _, l := range stepLines(t, dir) {
		step := int(l["step"].(float64))
		loss, has := l["eval_loss"]
		if has != (step%10 == 0) {
			t.Errorf("step %d: eval_loss present %v", step, has)
		}
		if has {
			evals = append(evals, loss.(float64))
			tokens = l["eval_tokens"].(float64)
		}
	}
	if len(evals) != 3 || !(evals[2] < 0.6*evals[0]) {
		t.Errorf("held-out losses %v: want 3, the last under 0.6 of the first", evals)
	}
	var sum map[string]any
	b, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err := json.Unmarshal(b, &sum); err != nil || sum["eval_loss"] != evals[2] || sum["eval_tokens"] != tokens || !(tokens > 0) {
		t.Errorf("summary.json eval_loss %v eval_tokens %v, want %v and %v (%v)", sum["eval_loss"], sum["eval_tokens"], evals[2], tokens, err)
	}
	t.Logf("held-out loss every 10 steps: %v over %v tokens", evals, tokens)
}

// TestTrainEvalKeepsRun: --eval-data (raw text cut into whole rows, so
// every token has a target) every 2 steps leaves the training as it was:
// the losses and model.safetensors of the run equal those of the run
// without it, bit for bit.
func TestTrainEvalKeepsRun(t *testing.T) {
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	data := writeFile(t, "corpus.txt", string(text))
	held := writeFile(t, "held.txt", strings.Repeat("held out text. ", 40)[:8*32+1]) // 8 rows of 32: 2 rounds of 2 ranks × 2 rows
	cfg := writeFile(t, "data.json", dataConfig)
	plain, evald := t.TempDir(), t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--data", data, "--steps", "6", "--out", plain, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	_, stderr, err := runApp(t, "train", "--config", cfg, "--data", data, "--eval-data", held, "--eval-every", "2", "--steps", "6", "--out", evald, "--no-progress")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if n := strings.Count(stderr, "eval after step"); n != 3 || !strings.Contains(stderr, "over 256 tokens") {
		t.Errorf("%d evaluations, want 3 (steps 2, 4, 6) over 256 tokens:\n%s", n, stderr)
	}
	sameLosses(t, "with --eval-data", stepLosses(t, evald), stepLosses(t, plain), 1, 6)
	a, _ := os.ReadFile(filepath.Join(plain, "model.safetensors"))
	b, _ := os.ReadFile(filepath.Join(evald, "model.safetensors"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Error("model.safetensors differs with --eval-data")
	}
}

// TestTrainDataErrors: a bad JSONL line stops the run before training
// with one error naming the file and line; a chat template Strata cannot
// render is refused naming its file; flags that do not go together are
// refused.
func TestTrainDataErrors(t *testing.T) {
	cfg := writeFile(t, "data.json", dataConfig)
	bad := writeFile(t, "bad.jsonl", `{"text": "ok"}`+"\n"+`{"messages": [{"role": "user"}]}`+"\n")
	_, _, err := runApp(t, "train", "--config", cfg, "--data", bad, "--steps", "1", "--no-progress")
	if err == nil || !strings.Contains(err.Error(), bad+`:2: message 1 has no "content"`) {
		t.Errorf("bad line: %v", err)
	}
	tmpl := writeFile(t, "t.jinja", "{% call m() %}{% endcall %}")
	good := writeFile(t, "good.jsonl", `{"text": "ok"}`+"\n")
	_, _, err = runApp(t, "train", "--config", cfg, "--data", good, "--chat-template", tmpl, "--steps", "1", "--no-progress")
	if err == nil || !strings.Contains(err.Error(), tmpl) || !strings.Contains(err.Error(), "{% call %} is not supported") {
		t.Errorf("unsupported template: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--data", good, "--epochs", "1", "--steps", "3"}, "give one"},
		{[]string{"--eval-every", "2"}, "--eval-every needs --eval-data"},
		{[]string{"--epochs", "0", "--data", good}, "need at least 1"},
	} {
		_, _, err := runApp(t, append([]string{"train", "--config", cfg, "--no-progress"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestEpochSteps: --epochs N is the steps N epochs of packed rows take
// with the config's global batch (the rows the data package counts), and
// for raw text as many windows as it has tokens per epoch.
func TestEpochSteps(t *testing.T) {
	cfg, err := config.Parse([]byte(dataConfig), "data.json", config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.SetDevices(2); err != nil {
		t.Fatal(err)
	}
	p := writeFile(t, "chat.jsonl", chatJSONL(200, 3))
	td, err := data.OpenTrainData(p, cfg, data.Options{Dir: t.TempDir()}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	d := &runData{train: td}
	for _, epochs := range []int{1, 3} {
		rows, err := td.Packed.EpochStart(epochs)
		if err != nil {
			t.Fatal(err)
		}
		g := int64(cfg.TrainBatchSize)
		got, err := epochSteps(d, cfg, epochs)
		if err != nil || int64(got) != (rows+g-1)/g || rows < int64(epochs) {
			t.Errorf("%d epochs: %d steps (%v), want ceil(%d rows / %d)", epochs, got, err, rows, g)
		}
	}
	txt := writeFile(t, "t.txt", strings.Repeat("x", 10_000))
	tt, err := data.OpenTrainData(txt, cfg, data.Options{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer tt.Close()
	// 10000 tokens / 32 = 312 windows an epoch, 2 epochs 624, global batch 8: 78 steps.
	if got, err := epochSteps(&runData{train: tt}, cfg, 2); err != nil || got != 78 {
		t.Errorf("raw text, 2 epochs: %d steps (%v), want 78", got, err)
	}
}

// TestTrainJSONLRSS: a 512 MiB JSONL file (tokenized into its token file,
// packed, shuffled) trains 3 steps in a child process whose peak RSS stays
// within that of the same run on a 16 MiB file + 32 MiB, a cap several
// times smaller than the file. Under the race detector the large file is
// 64 MiB (only the cap is checked: shadow memory). Needs the model side of
// Batch.Pos and model.IgnoreTarget.
func TestTrainJSONLRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes a 512 MiB file and trains on it in a child process")
	}
	dir := t.TempDir()
	cfgPath := writeFile(t, "data.json", dataConfig)
	small, large := filepath.Join(dir, "small.jsonl"), filepath.Join(dir, "large.jsonl")
	writeChatFile(t, small, 16<<20)
	largeBytes := int64(512 << 20)
	if raceEnabled {
		largeBytes = 64 << 20
	}
	writeChatFile(t, large, largeBytes)
	// The children's garbage collector is held to 32 MiB of Go memory:
	// on a loaded machine its lag lets garbage pile up by tens of MiB,
	// which is not what this measures (memory kept past the limit still
	// shows, and a run holding the file could not stay under it).
	t.Setenv("GOMEMLIMIT", "32MiB")
	const slackBytes = 32 << 20
	base := childPeakRSS(t, 0, "train", "--config", cfgPath, "--data", small, "--steps", "3", "--no-progress")
	bound := base + slackBytes
	peak := childPeakRSS(t, bound, "train", "--config", cfgPath, "--data", large, "--steps", "3", "--no-progress")
	t.Logf("peak RSS: %d MiB on a 16 MiB JSONL file, %d MiB on a %d MiB one (cap %d MiB)", base>>20, peak>>20, largeBytes>>20, bound>>20)
	if peak > bound {
		t.Errorf("peak RSS %d MiB on a %d MiB file, over %d MiB (the 16 MiB file's %d MiB + %d MiB): memory grows with the file",
			peak>>20, largeBytes>>20, bound>>20, base>>20, slackBytes>>20)
	}
	if !raceEnabled && 4*bound > largeBytes {
		t.Errorf("the cap %d MiB is not several times smaller than the %d MiB file", bound>>20, largeBytes>>20)
	}
}

// writeChatFile writes about sizeBytes of JSONL: text lines of 100-3000
// bytes, and every 20th line a block of generated conversations and
// prompt/completion lines (chatJSONL).
func writeChatFile(t *testing.T, path string, sizeBytes int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	chat := chatJSONL(20, 4)
	words := strings.Fields("the quick brown fox jumps over a lazy dog while seven engines hum along the river")
	for n, i := int64(0), 0; n < sizeBytes; i++ {
		var b strings.Builder
		for j := 0; b.Len() < 100+(i*7919)%2900; j++ {
			b.WriteString(words[(i+j*j)%len(words)] + " ")
		}
		line, _ := json.Marshal(map[string]string{"text": b.String()})
		line = append(line, '\n')
		if i%20 == 0 {
			line = append(line, chat...)
		}
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
		n += int64(len(line))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// byteLevelTokenizerJSON is a byte-level BPE tokenizer.json (GPT-2's
// byte-to-character map, no merges: ids 0-255 are the bytes) with
// "<|im_start|>" and "<|im_end|>" as special tokens 256 and 257.
func byteLevelTokenizerJSON() string {
	var bs []int
	for b := '!'; b <= '~'; b++ {
		bs = append(bs, int(b))
	}
	for b := 0xa1; b <= 0xac; b++ {
		bs = append(bs, b)
	}
	for b := 0xae; b <= 0xff; b++ {
		bs = append(bs, b)
	}
	char := map[int]rune{}
	for _, b := range bs {
		char[b] = rune(b)
	}
	n := 0
	for b := range 256 {
		if _, ok := char[b]; !ok {
			char[b] = rune(256 + n)
			n++
		}
	}
	vocab := map[string]int{}
	for b := range 256 {
		vocab[string(char[b])] = b
	}
	v, _ := json.Marshal(vocab)
	added := `[{"id": 256, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
	           {"id": 257, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}]`
	return `{"version": "1.0", "truncation": null, "padding": null, "added_tokens": ` + added + `, "normalizer": null,
	  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
	  "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
	  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
	  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "", "end_of_word_suffix": "",
	    "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": ` + string(v) + `, "merges": []}}`
}

// TestTrainInitTokenizer: `strata train --init HF --data chat.jsonl
// --eval-data` tokenizes both with the model's tokenizer.json (its
// special tokens one id each) and renders the conversations with the chat
// template of its tokenizer_config.json, whose eos_token ends each turn.
func TestTrainInitTokenizer(t *testing.T) {
	dir := t.TempDir()
	hf := filepath.Join(dir, "model")
	shape := initShape
	shape.Vocab = 264 // the 256 bytes and the two special tokens fit
	writeHFModel(t, hf, shape, 11)
	files := map[string]string{
		"tokenizer.json": byteLevelTokenizerJSON(),
		"tokenizer_config.json": `{"eos_token": "<|im_end|>", "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}` +
			`{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(hf, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	line := `{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}` + "\n"
	chat := writeFile(t, "chat.jsonl", strings.Repeat(line, 3))
	cfg := writeFile(t, "cfg.json", fmt.Sprintf(frozenConfig, ""))
	_, stderr, err := runApp(t, "train", "--init", hf, "--config", cfg, "--data", chat, "--eval-data", chat, "--steps", "2", "--no-progress")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	// "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n": 65 bytes, 25 ids
	// (each special token one); "yo<|im_end|>\n" trained: 4 ids.
	for _, want := range []string{"tokenizer: " + filepath.Join(hf, "tokenizer.json"), "3 examples (0 text, 0 prompt/completion, 3 chat), 75 tokens of which 12 trained",
		"chat template: " + filepath.Join(hf, "tokenizer_config.json"), "over 12 tokens"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
}
