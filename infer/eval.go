package infer

import (
	"context"
	"encoding/binary"
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
)

// DefaultEvalSeq is the window an evaluation takes when none is given and
// the model is not a Strata run's (whose seq_len it takes): the model's
// max_seq_len, at most this.
const DefaultEvalSeq = 1024

// EvalSeq is the window of an evaluation asked for seq tokens (0: the
// default: the run's seq_len, else DefaultEvalSeq, at most the model's
// max_seq_len); a seq past the model's max_seq_len is refused.
func (m *Model) EvalSeq(seq int) (int, error) {
	s := m.Shape()
	if seq == 0 {
		seq = min(s.MaxSeq, DefaultEvalSeq)
		if n := m.Source.RunSeqLen(); n > 0 {
			seq = min(s.MaxSeq, n)
		}
	}
	if seq > s.MaxSeq {
		return 0, fmt.Errorf("%s: --seq %d is past the model's max_seq_len %d", m.name, seq, s.MaxSeq)
	}
	return seq, nil
}

// EvalInput is what Evaluate scores; set one field.
type EvalInput struct {
	// Tokens are scored as a text's tokens: cut into windows of
	// EvalOptions.Seq (inputs t[s:s+N], targets t[s+1:s+N+1] for s = 0,
	// N, 2N, ...; the last window may be shorter), each from an empty
	// context.
	Tokens []int32
	// Text is a text file, read and tokenized about 1 MiB at a time, its
	// tokens windowed as Tokens' (a nil tokenizer: the model's). Evaluate
	// reads it; the caller closes it.
	Text *TokenStream
	// Examples are packed rows (data.NewEvalSet: JSONL, Parquet or Arrow
	// examples, or a text file's windows), the loss only on their
	// targets (model.IgnoreTarget elsewhere). Resident, each example of a
	// row is scored alone from an empty cache, as the packed row's
	// attention sees it; streamed, the rows go through the engine whole.
	Examples *data.EvalSet
	// Name is how errors name the input (a file's path); default the
	// Text's path, else "the tokens" or "the examples".
	Name string
}

// EvalOptions are Evaluate's options.
type EvalOptions struct {
	// Seq is the window in tokens (EvalSeq resolves 0). Resident, the
	// decoder's capacity must hold it (Load); Examples' rows are the
	// set's.
	Seq int
	// BOS puts the tokenizer's BOS before Tokens or Text (it is
	// predicted from, not predicted). Resident only.
	BOS bool
	// Logits, when set, receives every predicted token's logits:
	// little-endian float32, a row of vocab_size values per token, in
	// order. Resident only.
	Logits io.Writer
	// TokenLosses asks for each predicted token's loss in
	// EvalResult.TokenLosses. Resident only.
	TokenLosses bool
	// Progress, when set, is called about every ProgressEvery (default 10
	// s) of a long evaluation, never concurrently.
	Progress      func(EvalProgress)
	ProgressEvery time.Duration
	// Offload streams the weights from host RAM ("cpu") or NVMe ("nvme",
	// with NVMePath, the directory of the swap file) through the device
	// by an inference engine, Batch rows a pass (default 4); "": the
	// weights resident on the device (Load first).
	Offload  string
	NVMePath string
	Batch    int
}

// EvalProgress is how far an evaluation is.
type EvalProgress struct {
	// Bytes of SizeBytes of a text file read (Text).
	Bytes, SizeBytes int64
	// Rows of TotalRows done (Examples).
	Rows, TotalRows int64
	// Tokens predicted so far, their mean Loss (NaN before the first),
	// and the time since the start.
	Tokens  int64
	Loss    float64
	Elapsed time.Duration
}

// EvalResult is an evaluation's outcome; its JSON is `strata eval --json`'s.
type EvalResult struct {
	// Loss is the mean cross-entropy (natural log) over every predicted
	// token, PPL exp(Loss).
	Loss   float64 `json:"loss"`
	Tokens int64   `json:"tokens"`
	PPL    float64 `json:"ppl"`
	// Windows are the windows (the rows of Examples) evaluated, of at
	// most Seq tokens.
	Windows int64 `json:"windows"`
	Seq     int   `json:"seq"`
	// Params is the dtype the parameters were held in.
	Params string `json:"params"`
	// Examples is the count of examples scored (Examples input).
	Examples int64 `json:"-"`
	// TokenLosses are the predicted tokens' losses, in order
	// (EvalOptions.TokenLosses).
	TokenLosses []float32 `json:"-"`
	// DevicePeakBytes is the device's peak of all allocations (streamed).
	DevicePeakBytes int64 `json:"-"`
	// Duration is the evaluation's wall time.
	Duration time.Duration `json:"-"`
}

// Evaluate scores in with m: the mean next-token loss, the perplexity and
// (asked for) each token's loss. Resident (opts.Offload ""), m must be
// loaded (Load) with a decoder of capacity opts.Seq; streamed, m must not
// be, and in must be Examples. A cancelled ctx stops it between windows.
func Evaluate(ctx context.Context, m *Model, in EvalInput, opts EvalOptions) (EvalResult, error) {
	if opts.Offload != "" {
		return evaluateStreamed(ctx, m, in, opts)
	}
	switch {
	case !m.Loaded():
		return EvalResult{}, fmt.Errorf("%s: evaluate: the model is not loaded (Model.Load)", m.name)
	case opts.Seq < 1 || opts.Seq > m.decOpts.Capacity:
		return EvalResult{}, fmt.Errorf("%s: evaluate: a window of %d tokens; the decoder holds 1 to %d", m.name, opts.Seq, m.decOpts.Capacity)
	case in.Examples != nil && opts.BOS:
		return EvalResult{}, fmt.Errorf("%s: evaluate: BOS is for tokens and text, not examples (they take the tokenizer's special tokens as training adds them)", m.name)
	}
	e := &evalRun{ctx: ctx, m: m, seq: opts.Seq, s: m.Device.DefaultStream(), opts: opts, start: time.Now()}
	if e.opts.ProgressEvery == 0 {
		e.opts.ProgressEvery = evalProgressEvery
	}
	if opts.BOS {
		bos, ok := m.Tokenizer.BOS()
		if !ok {
			return EvalResult{}, fmt.Errorf("%s: --bos: the tokenizer (%s) names no BOS token", m.name, m.TokenizerFrom)
		}
		e.pending = append(e.pending, bos)
	}
	var err error
	switch {
	case in.Examples != nil:
		e.what = orDefault(in.Name, "the examples")
		err = e.runExamples(in.Examples)
	case in.Text != nil:
		if in.Text.tok == nil {
			in.Text.tok = m.Tokenizer
		}
		e.ts, e.what = in.Text, orDefault(in.Name, in.Text.path)
		err = e.run(in.Text.Next)
	default:
		e.what = orDefault(in.Name, "the tokens")
		done := false
		err = e.run(func() ([]int32, error) {
			if done {
				return nil, nil
			}
			done = true
			return in.Tokens, nil
		})
	}
	if err != nil {
		return EvalResult{}, err
	}
	loss := e.sum / float64(e.counted)
	return EvalResult{Loss: loss, Tokens: e.counted, PPL: math.Exp(loss), Windows: e.windows, Seq: opts.Seq, Params: m.DType.String(),
		Examples: e.examples, TokenLosses: e.losses, Duration: time.Since(e.start)}, nil
}

// evalRun cuts the token stream into windows and scores them.
type evalRun struct {
	ctx      context.Context
	m        *Model
	seq      int
	s        gpu.Stream
	opts     EvalOptions
	ts       *TokenStream
	what     string  // the input, for errors
	pending  []int32 // tokens not yet predicted from, the first a window's first input
	sum      float64 // the losses, summed in float64 in token order
	counted  int64
	windows  int64
	losses   []float32 // TokenLosses
	row      []byte
	werr     error   // the first write error of Logits
	targets  []int32 // the targets of the tokens being scored
	examples int64   // Examples: the examples evaluated
	start    time.Time
	reported time.Time
}

// evalProgressEvery is how often a long evaluation reports.
const evalProgressEvery = 10 * time.Second

// run reads the whole stream: full windows of seq+1 tokens as they come
// (the last token of one is the first of the next), then what is left.
func (e *evalRun) run(next func() ([]int32, error)) error {
	for {
		ids, err := next()
		if err != nil {
			return fmt.Errorf("%s: --data: %w", e.m.name, err)
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
		e.progress(0, 0)
	}
	if len(e.pending) >= 2 {
		if err := e.window(e.pending); err != nil {
			return err
		}
	}
	if e.counted == 0 {
		return fmt.Errorf("%s: --data %s holds %d token(s): nothing to predict", e.m.name, e.what, len(e.pending))
	}
	return nil
}

// window scores inputs w[:n-1] against targets w[1:] from an empty cache.
func (e *evalRun) window(w []int32) error { return e.score(w[:len(w)-1], w[1:]) }

// score scores ids against targets (model.IgnoreTarget: not predicted)
// from an empty cache.
func (e *evalRun) score(ids, targets []int32) error {
	if err := e.ctx.Err(); err != nil {
		return err
	}
	d := e.m.dec
	d.Reset()
	var rowFn func(int, []float32)
	if e.opts.Logits != nil || e.opts.TokenLosses {
		e.targets = targets
		rowFn = e.row1
	}
	sum, n, err := d.Score(e.s, e.m.params(), ids, targets, rowFn)
	if err != nil {
		return fmt.Errorf("%s: window %d (tokens %d..): %w", e.m.name, e.windows, e.counted, err)
	}
	if e.werr != nil {
		return fmt.Errorf("%s: --logits: %w", e.m.name, e.werr)
	}
	e.sum += sum
	e.counted += int64(n)
	e.windows++
	return nil
}

// row1 takes one row of logits: a predicted token's (not one whose target
// is model.IgnoreTarget) is written to Logits and its loss kept; a write
// error is kept and reported after the window.
func (e *evalRun) row1(row int, v []float32) {
	t := e.targets[row]
	if t == model.IgnoreTarget {
		return
	}
	if e.opts.TokenLosses {
		e.losses = append(e.losses, tokenLoss(v, t))
	}
	if e.opts.Logits == nil || e.werr != nil {
		return
	}
	if len(e.row) != 4*len(v) {
		e.row = make([]byte, 4*len(v))
	}
	for i, x := range v {
		binary.LittleEndian.PutUint32(e.row[4*i:], math.Float32bits(x))
	}
	_, e.werr = e.opts.Logits.Write(e.row)
}

// tokenLoss is the cross-entropy of target under logits v, computed in
// float64: log(sum(exp(v))) - v[target].
func tokenLoss(v []float32, target int32) float32 {
	mx := float64(v[0])
	for _, x := range v {
		mx = max(mx, float64(x))
	}
	var total float64
	for _, x := range v {
		total += math.Exp(float64(x) - mx)
	}
	return float32(mx + math.Log(total) - float64(v[target]))
}

// runExamples scores the rows of set, each example of a row (Batch.Pos
// restarts at 0) from an empty cache, as the packed row's attention sees
// it alone.
func (e *evalRun) runExamples(set *data.EvalSet) error {
	for r := range set.Len() {
		b, err := set.Rows(r, 1)
		if err != nil {
			return fmt.Errorf("%s: --data %s: row %d: %w", e.m.name, e.what, r, err)
		}
		for i := 0; i < len(b.IDs); {
			j := i + 1
			for j < len(b.IDs) && (b.Pos == nil || b.Pos[j] != 0) {
				j++
			}
			if hasTarget(b.Targets[i:j]) {
				e.examples++
				if err := e.score(b.IDs[i:j], b.Targets[i:j]); err != nil {
					return err
				}
			}
			i = j
		}
		e.progress(r+1, set.Len())
	}
	e.windows = set.Len() // rows, not the examples scored
	if e.counted != set.Targets() {
		return fmt.Errorf("%s: --data %s: scored %d tokens, the evaluation set holds %d targets", e.m.name, e.what, e.counted, set.Targets())
	}
	if e.counted == 0 {
		return fmt.Errorf("%s: --data %s: no trained token to predict", e.m.name, e.what)
	}
	return nil
}

// hasTarget says whether any of targets counts.
func hasTarget(targets []int32) bool {
	for _, t := range targets {
		if t != model.IgnoreTarget {
			return true
		}
	}
	return false
}

// progress calls Progress every ProgressEvery (since the start and since
// the last call).
func (e *evalRun) progress(rows, total int64) {
	if e.opts.Progress == nil {
		return
	}
	now := time.Now()
	if now.Sub(e.start) < e.opts.ProgressEvery || now.Sub(e.reported) < e.opts.ProgressEvery {
		return
	}
	e.reported = now
	p := EvalProgress{Rows: rows, TotalRows: total, Tokens: e.counted, Loss: math.NaN(), Elapsed: now.Sub(e.start)}
	if e.counted > 0 {
		p.Loss = e.sum / float64(e.counted)
	}
	if e.ts != nil {
		p.Bytes, p.SizeBytes = e.ts.off, e.ts.size
	}
	e.opts.Progress(p)
}

// Blocks of a TokenStream: how much of the file is tokenized at a time,
// and the most held while no cut is found (past it the block is cut
// anyway).
const (
	DefaultBlockBytes    = 1 << 20
	DefaultMaxBlockBytes = 64 << 20
)

// TokenStream reads a text file a block at a time and tokenizes each
// block, each cut before a space that follows a printable ASCII character,
// where the GPT-2, Llama-3 and Qwen2 pre-tokenizers split anyway: the ids
// are those of the whole file (unless an added token contains such a
// space).
type TokenStream struct {
	// BlockBytes and MaxBlockBytes are the block read at a time and the
	// most held while no cut is found (DefaultBlockBytes,
	// DefaultMaxBlockBytes).
	BlockBytes, MaxBlockBytes int

	path      string
	f         *os.File
	tok       *tokenizer.Tokenizer
	size, off int64
	buf       []byte // read, not yet tokenized
	eof       bool
}

// OpenTokenStream opens the regular file at path to be read with tok
// (nil: Evaluate gives it the model's).
func OpenTokenStream(path string, tok *tokenizer.Tokenizer) (*TokenStream, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &TokenStream{BlockBytes: DefaultBlockBytes, MaxBlockBytes: DefaultMaxBlockBytes, path: path, f: f, tok: tok, size: fi.Size()}, nil
}

// Close closes the file.
func (ts *TokenStream) Close() error { return ts.f.Close() }

// Next returns the ids of the next block, nil at the end of the file.
func (ts *TokenStream) Next() ([]int32, error) {
	for !ts.eof || len(ts.buf) > 0 {
		if !ts.eof {
			n := len(ts.buf)
			ts.buf = append(ts.buf, make([]byte, ts.BlockBytes)...)
			got, err := io.ReadFull(ts.f, ts.buf[n:])
			ts.buf, ts.off = ts.buf[:n+got], ts.off+int64(got)
			switch {
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
				ts.eof = true
			case err != nil:
				return nil, fmt.Errorf("read %s at offset %d: %w", ts.path, ts.off, err)
			}
		}
		cut := len(ts.buf)
		if !ts.eof {
			if cut = safeCut(ts.buf); cut == 0 && len(ts.buf) < ts.MaxBlockBytes {
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

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
