package cmd

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/tokenizer"
	"github.com/urfave/cli/v2"
)

// defaultEvalSeq is --seq when it is not given and the model is not a
// Strata run's (whose seq_len it takes): the model's max_seq_len, at most
// this.
const defaultEvalSeq = 1024

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:      "eval",
		Usage:     "mean next-token loss and perplexity of a model on a text file",
		UsageText: "strata eval --model PATH --data FILE [--seq N] [--json] [--backend cpu|cuda] [--hbm BYTES] [--dtype auto|fp32|bf16] [--bos] [--logits OUT] [--chat-template PATH]",
		Description: "Evaluates the model of --model, a Hugging Face model directory (its tokenizer.json) or a Strata run\n" +
			"directory or checkpoint (the tokenizer.json of the source its run recorded, else the byte tokenizer for\n" +
			"a vocabulary of 256), on FILE. The file's tokens t are cut into windows: inputs t[s:s+N], targets\n" +
			"t[s+1:s+N+1] for s = 0, N, 2N, ... (the last window may be shorter), each run from an empty context;\n" +
			"the loss is the mean cross-entropy (natural log) over every predicted token of the file, the\n" +
			"perplexity exp(loss). Prints loss, tokens (predicted) and perplexity; --json one object with keys\n" +
			"loss, tokens, ppl.\n\n" +
			"Weights stored in F32 (or F16) are evaluated in fp32, weights stored in BF16 in bf16 (--dtype\n" +
			"overrides); activations and the key/value cache are fp32. One device (--backend cpu, the default,\n" +
			"or cuda) holds every parameter, uploaded one chunk at a time, and one window's activations: a model\n" +
			"that does not fit is refused, saying what it needs. With --offload cpu or --offload nvme (and --nvme-path)\n" +
			"the weights stay in host RAM or on NVMe and stream through the device as training streams them (an\n" +
			"inference engine: stage 3, every chunk frozen, the tier store's planner bringing each chunk ahead of its\n" +
			"use), --batch windows at a time, the device holding two chunks and a batch's activations (fp32): a model\n" +
			"many times the device's memory evaluates. The windows are the same, the params bf16 (as training's\n" +
			"offloaded params); on the CPU backend the loss is the resident evaluation's (--dtype bf16) bit for bit.\n" +
			"--bos and --logits are for the resident path.\n\n" +
			"The file is read and tokenized about 1 MiB at a time, each block cut before a space that follows a\n" +
			"printable ASCII character, where the GPT-2, Llama-3 and Qwen2 pre-tokenizers split anyway: the ids\n" +
			"are those of the whole file (unless an added token contains such a space). Progress goes to stderr.\n\n" +
			"A JSONL file ({\"text\"}, {\"prompt\", \"completion\"}, {\"messages\"}: by extension .jsonl, else a first\n" +
			"line that is such an object), or Parquet or Arrow (with train's column conventions and --data-columns;\n" +
			"a DatasetDict's validation split, else its test split) is read as train --eval-data reads it: the same tokenizer, special tokens\n" +
			"and chat template (--chat-template, else the one a Strata run recorded, else the model's, else ChatML), its examples packed in file order\n" +
			"into rows of N, each example scored alone, the loss only on the tokens training learns from (the\n" +
			"completions, the assistant's turns): the loss and tokens train --eval-data reports for the same\n" +
			"weights and seq_len. --logits then holds those tokens' rows.",
		Flags: append(inferFlags(),
			&cli.StringFlag{Name: "data", Required: true, Usage: "the text to evaluate on, or examples (JSONL, Parquet or Arrow: a file, a directory or glob of shards, a save_to_disk directory) read as train --eval-data reads them"},
			&cli.StringFlag{Name: "data-columns", Usage: "examples: the names --data holds their fields under, as train's --data-columns"},
			&cli.IntFlag{Name: "seq", Usage: fmt.Sprintf("tokens per window, N (default: a Strata run's seq_len, else the model's max_seq_len, at most %d)", defaultEvalSeq)},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object: loss, tokens, ppl (and windows, seq, params)"},
			&cli.BoolFlag{Name: "bos", Usage: "put the tokenizer's BOS token before the file's tokens (it is predicted from, not predicted)"},
			&cli.StringFlag{Name: "logits", Usage: "write every predicted token's logits to OUT: little-endian float32, a row of vocab_size values per token, in order"},
			&cli.StringFlag{Name: "offload", Usage: "stream the weights from host RAM (cpu) or NVMe (nvme, with --nvme-path) through the device: a model larger than the device"},
			&cli.StringFlag{Name: "nvme-path", Usage: "--offload nvme: the directory of the swap file (on the drive)"},
			&cli.IntFlag{Name: "batch", Value: 4, Usage: "--offload: windows evaluated together (the weights stream once per batch)"},
			&cli.StringFlag{Name: "chat-template", Usage: "JSONL --data: the chat template of {\"messages\"} lines, as train's (default: the run's, else the model's, else ChatML)"},
		),
		Action: func(c *cli.Context) error { return runEval(c, c.App.Writer, c.App.ErrWriter) },
	}
}

// evalResult is what eval prints (--json: this object).
type evalResult struct {
	Loss    float64 `json:"loss"`
	Tokens  int64   `json:"tokens"`
	PPL     float64 `json:"ppl"`
	Windows int64   `json:"windows"`
	Seq     int     `json:"seq"`
	Params  string  `json:"params"`
}

func runEval(c *cli.Context, stdout, stderr io.Writer) error {
	if err := checkAddressSpace("eval"); err != nil {
		return err
	}
	seq := c.Int("seq")
	if c.IsSet("seq") && seq < 1 {
		return usagef("eval: --seq %d: need at least 1", seq)
	}
	if c.IsSet("offload") {
		return runEvalStreamed(c, seq, stdout, stderr)
	}
	for _, f := range []string{"nvme-path", "batch"} {
		if c.IsSet(f) {
			return usagef("eval: --%s is for --offload (the weights streamed from host RAM or NVMe)", f)
		}
	}
	// Examples (JSONL, Parquet, Arrow) are read as train's --eval-data
	// reads them (evalJSONL): a file DetectFormat cannot read is opened
	// as text, which says why.
	jsonl := false
	f, err := data.DetectFormat(c.String("data"))
	if errors.Is(err, data.ErrBinary) {
		return fmt.Errorf("eval: --data: %w", err)
	}
	if err == nil && f.Examples() {
		jsonl = true
		if c.Bool("bos") {
			name := map[data.Format]string{data.JSONL: "JSONL", data.Parquet: "Parquet", data.Arrow: "Arrow"}[f]
			return usagef("eval: --bos: --data %s is %s, whose examples take the tokenizer's special tokens as training adds them; --bos is for raw text", c.String("data"), name)
		}
	}
	var ts *tokenStream
	if !jsonl {
		var err error
		if ts, err = openTokenStream(c.String("data")); err != nil {
			return err
		}
		defer ts.close()
	}
	m, err := openInference(c, "eval", func(m *inferModel) (model.DecoderOptions, error) {
		s := m.im.shape
		if seq == 0 {
			seq = min(s.MaxSeq, defaultEvalSeq)
			if n := m.runSeqLen(); n > 0 {
				seq = min(s.MaxSeq, n)
			}
		}
		if seq > s.MaxSeq {
			return model.DecoderOptions{}, usagef("eval: --seq %d is past the model's max_seq_len %d", seq, s.MaxSeq)
		}
		return model.DecoderOptions{Capacity: seq}, nil
	}, stderr)
	if err != nil {
		return err
	}
	defer m.close()
	e := &evalRun{m: m, seq: seq, s: m.dev.DefaultStream(), stderr: stderr, ts: ts, start: time.Now()}
	if ts != nil {
		ts.tok = m.tok
	}
	if c.Bool("bos") {
		bos, ok := m.tok.BOS()
		if !ok {
			return fmt.Errorf("eval: --bos: the tokenizer (%s) names no BOS token", m.tokFrom)
		}
		e.pending = append(e.pending, bos)
	}
	if path := c.String("logits"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("eval: --logits: %w", err)
		}
		defer f.Close()
		e.logits = bufio.NewWriterSize(f, 1<<20)
		e.logitsFile = f
	}
	if jsonl {
		if err := e.runJSONL(c); err != nil {
			return err
		}
	} else if err := e.run(); err != nil {
		return err
	}
	if e.logits != nil {
		if err := e.logits.Flush(); err != nil {
			return fmt.Errorf("eval: --logits: %w", err)
		}
		if err := e.logitsFile.Close(); err != nil {
			return fmt.Errorf("eval: --logits: %w", err)
		}
	}
	loss := e.sum / float64(e.counted)
	r := evalResult{Loss: loss, Tokens: e.counted, PPL: math.Exp(loss), Windows: e.windows, Seq: seq, Params: m.dt.String()}
	if c.Bool("json") {
		b, _ := json.Marshal(r)
		fmt.Fprintf(stdout, "%s\n", b)
		return nil
	}
	fmt.Fprintf(stdout, "loss        %.6f (nats per token)\n", r.Loss)
	if jsonl {
		fmt.Fprintf(stdout, "tokens      %d (predicted and trained: the completions' and the assistant's; %d examples in %d rows of %d tokens, as train --eval-data packs them)\n", r.Tokens, e.examples, r.Windows, seq)
	} else {
		fmt.Fprintf(stdout, "tokens      %d (predicted; windows: %d of at most %d tokens)\n", r.Tokens, r.Windows, seq)
	}
	fmt.Fprintf(stdout, "perplexity  %.4f\n", r.PPL)
	return nil
}

// evalRun cuts the token stream into windows and scores them.
type evalRun struct {
	m          *inferModel
	seq        int
	s          gpu.Stream
	stderr     io.Writer
	ts         *tokenStream
	pending    []int32 // tokens not yet predicted from, the first a window's first input
	sum        float64 // the losses, summed in float64 in token order
	counted    int64
	windows    int64
	logits     *bufio.Writer
	logitsFile *os.File
	row        []byte
	werr       error   // the first write error of --logits
	targets    []int32 // the targets of the tokens being scored
	examples   int64   // JSONL: the examples evaluated
	start      time.Time
	reported   time.Time
}

// evalProgressEvery is how often a long evaluation reports on stderr.
const evalProgressEvery = 10 * time.Second

// run reads the whole stream: full windows of seq+1 tokens as they come
// (the last token of one is the first of the next), then what is left.
func (e *evalRun) run() error {
	for {
		ids, err := e.ts.next()
		if err != nil {
			return err
		}
		if ids == nil {
			break
		}
		e.pending = append(e.pending, ids...)
		off := 0
		for len(e.pending)-off > e.seq {
			if err := e.window(e.pending[off : off+e.seq+1]); err != nil {
				return err
			}
			off += e.seq
		}
		e.pending = append(e.pending[:0], e.pending[off:]...)
		e.progress()
	}
	if len(e.pending) >= 2 {
		if err := e.window(e.pending); err != nil {
			return err
		}
	}
	if e.counted == 0 {
		return fmt.Errorf("eval: --data %s holds %d token(s): nothing to predict", e.ts.path, len(e.pending))
	}
	return nil
}

// window scores inputs w[:n-1] against targets w[1:] from an empty cache.
func (e *evalRun) window(w []int32) error { return e.score(w[:len(w)-1], w[1:]) }

// score scores ids against targets (model.IgnoreTarget: not predicted)
// from an empty cache.
func (e *evalRun) score(ids, targets []int32) error {
	d := e.m.dec
	d.Reset()
	var rowFn func(int, []float32)
	if e.logits != nil {
		e.targets = targets
		rowFn = e.writeLogits
	}
	sum, n, err := d.Score(e.s, e.m.w, ids, targets, rowFn)
	if err != nil {
		return fmt.Errorf("eval: window %d (tokens %d..): %w", e.windows, e.counted, err)
	}
	if e.werr != nil {
		return fmt.Errorf("eval: --logits: %w", e.werr)
	}
	e.sum += sum
	e.counted += int64(n)
	e.windows++
	return nil
}

// writeLogits appends one row to --logits (a predicted token's: not one
// whose target is model.IgnoreTarget); a write error is kept and reported
// after the window.
func (e *evalRun) writeLogits(row int, v []float32) {
	if e.werr != nil || e.targets[row] == model.IgnoreTarget {
		return
	}
	if len(e.row) != 4*len(v) {
		e.row = make([]byte, 4*len(v))
	}
	for i, x := range v {
		binary.LittleEndian.PutUint32(e.row[4*i:], math.Float32bits(x))
	}
	_, e.werr = e.logits.Write(e.row)
}

// progress reports on stderr every evalProgressEvery.
func (e *evalRun) progress() {
	loss, due := e.progressDue()
	if !due {
		return
	}
	fmt.Fprintf(e.stderr, "eval: %.1f%% of %s, %d tokens, %.0f tokens/s, loss so far %.4f\n",
		100*float64(e.ts.off)/float64(max(1, e.ts.size)), e.ts.path, e.counted, float64(e.counted)/e.reported.Sub(e.start).Seconds(), loss)
}

// progressDue says whether a progress line is due (evalProgressEvery
// since the start and since the last one), marking it reported, and the
// mean loss so far (NaN before the first token).
func (e *evalRun) progressDue() (float64, bool) {
	now := time.Now()
	if now.Sub(e.start) < evalProgressEvery || now.Sub(e.reported) < evalProgressEvery {
		return 0, false
	}
	e.reported = now
	if e.counted == 0 {
		return math.NaN(), true
	}
	return e.sum / float64(e.counted), true
}

// Blocks of the token stream: how much of the file is tokenized at a
// time, and the most held while no cut is found (past it the block is
// cut anyway).
var (
	evalBlockBytes    = 1 << 20
	evalMaxBlockBytes = 64 << 20
)

// tokenStream reads a file a block at a time and tokenizes each block.
type tokenStream struct {
	path      string
	f         *os.File
	tok       *tokenizer.Tokenizer
	size, off int64
	buf       []byte // read, not yet tokenized
	eof       bool
}

func openTokenStream(path string) (*tokenStream, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("eval: --data: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("eval: --data: %w", err)
	}
	return &tokenStream{path: path, f: f, size: fi.Size()}, nil
}

func (ts *tokenStream) close() { ts.f.Close() }

// next returns the ids of the next block, nil at the end of the file.
func (ts *tokenStream) next() ([]int32, error) {
	for !ts.eof || len(ts.buf) > 0 {
		if !ts.eof {
			n := len(ts.buf)
			ts.buf = append(ts.buf, make([]byte, evalBlockBytes)...)
			got, err := io.ReadFull(ts.f, ts.buf[n:])
			ts.buf, ts.off = ts.buf[:n+got], ts.off+int64(got)
			switch {
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
				ts.eof = true
			case err != nil:
				return nil, fmt.Errorf("eval: --data: read %s at offset %d: %w", ts.path, ts.off, err)
			}
		}
		cut := len(ts.buf)
		if !ts.eof {
			if cut = safeCut(ts.buf); cut == 0 && len(ts.buf) < evalMaxBlockBytes {
				continue
			} else if cut == 0 {
				cut = len(ts.buf)
			}
		}
		ids := ts.tok.Encode(string(ts.buf[:cut]), false)
		ts.buf = append(ts.buf[:0], ts.buf[cut:]...)
		if len(ids) > 0 {
			return ids, nil
		}
	}
	return nil, nil
}

// safeCut is the last i > 0 with b[i] a space and b[i-1] a printable
// ASCII character other than space, or 0: the pre-tokenizers of GPT-2
// (ByteLevel's regex), Llama-3 and Qwen2 end a piece there (no pattern
// puts a space after a non-space in one piece), a NFC normalizer composes
// nothing across it, and a ByteLevel add_prefix_space finds the space it
// would add.
func safeCut(b []byte) int {
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ' ' && b[i-1] > ' ' && b[i-1] < 0x7f {
			return i
		}
	}
	return 0
}
