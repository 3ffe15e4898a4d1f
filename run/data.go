package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/tokenizer"
)

// Data is what a run trains on and evaluates (OpenData).
type Data struct {
	train   *data.TrainData // nil: the synthetic corpus
	eval    *data.EvalSet   // nil: no --eval-data
	evalSrc *data.Source
	every   int
	// ids identify the training data, in every checkpoint (dataid.go).
	ids []checkpoint.DataFile
	// chat is the chat template of the training data's {"messages"}
	// lines, recorded in every checkpoint; nil when it has none.
	chat *data.ChatTemplate
}

// Close closes the data files.
func (d *Data) Close() {
	if d == nil {
		return
	}
	if d.train != nil {
		d.train.Close()
	}
	if d.evalSrc != nil {
		d.evalSrc.Close()
	}
}

// runTokenizer is the tokenizer the run's data is tokenized with: the
// tokenizer.json of the model the run started from (--init, or the
// resumed run's record of it), else the byte-level one. It returns a
// description for the run's header.
func runTokenizer(cfg *config.Config, source *hf.Source) (data.Tokenizer, string, error) {
	if source == nil || source.TokenizerPath() == "" {
		return data.Bytes{}, "bytes", nil
	}
	path := source.TokenizerPath()
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, "", fmt.Errorf("train: the model's tokenizer: %w", err)
	}
	if v := cfg.Shape().Vocab; tok.VocabSize() > v {
		return nil, "", fmt.Errorf("train: the tokenizer %s has %d ids, more than the model's vocabulary of %d", path, tok.VocabSize(), v)
	}
	return tok, path, nil
}

// tokenDir is where the run's token files go: --out when it exists, else
// the directory it will be created in (the run's disk, not a RAM-backed
// /tmp), else os.TempDir.
func tokenDir(out string) string {
	for _, d := range []string{out, filepath.Dir(filepath.Clean(out))} {
		if fi, err := os.Stat(d); out != "" && err == nil && fi.IsDir() {
			return d
		}
	}
	return ""
}

// DataOptions says how OpenData reads a run's data.
type DataOptions struct {
	// EvalData is the held-out data (the same formats; a DatasetDict's
	// validation split, else its test split), "" for none; EvalEvery how
	// often it is evaluated (0: only after the last step).
	EvalData  string
	EvalEvery int
	// Chat is the chat template of {"messages"} examples; nil for ChatML.
	Chat *data.ChatTemplate
	// NoShuffle packs JSONL examples in file order in every epoch.
	NoShuffle bool
	// Out is the run directory: the token files go there (or beside it).
	Out string
	// Source is where the run's weights came from: its tokenizer
	// tokenizes the data (nil: the byte-level tokenizer).
	Source *hf.Source
	// DataGiven says strata.data was given for this run (not read from a
	// resumed run's config, where a relative path is the old run's).
	DataGiven bool
}

// OpenData opens cfg's strata.data and o.EvalData for a run (data files
// are tokenized in one streaming pass with the model's tokenizer: JSONL
// always, raw text with a tokenizer other than bytes) and says what they
// hold on w. Cancelling ctx stops the tokenizing.
func OpenData(ctx context.Context, cfg *config.Config, o DataOptions, w io.Writer) (*Data, error) {
	if w == nil {
		w = io.Discard
	}
	stderr := w
	d := &Data{every: o.EvalEvery, ids: identifyRunData(cfg)}
	if cfg.Strata.Data == "" && o.EvalData == "" {
		return d, nil
	}
	tok, tokName, err := runTokenizer(cfg, o.Source)
	if err != nil {
		return nil, err
	}
	chat := o.Chat
	if chat == nil {
		chat = data.DefaultChatTemplate()
	}
	cols, err := data.ParseColumns(cfg.Strata.DataColumns)
	if err != nil {
		return nil, inputf("train: --data-columns (strata.data_columns) %q: %v", cfg.Strata.DataColumns, err)
	}
	do := data.Options{Tokenizer: tok, Chat: chat, Dir: tokenDir(o.Out), Context: ctx, Columns: cols}
	fmt.Fprintf(stderr, "tokenizer: %s\n", tokName)
	if path := cfg.Strata.Data; path != "" {
		t0 := time.Now()
		td, err := data.OpenTrainData(path, cfg, do, !o.NoShuffle)
		if err != nil && !o.DataGiven && !filepath.IsAbs(path) && errors.Is(err, fs.ErrNotExist) {
			// The resumed run's config names it relative to the directory
			// that run was started in (runs since record it absolute).
			wd, _ := os.Getwd()
			return nil, fmt.Errorf("train: the run's training data %q (strata.data of its config, a path relative to the directory that run was started in) is not in %s: resume from that directory, or pass --data PATH", path, wd)
		}
		if err != nil {
			return nil, fmt.Errorf("train: --data: %w", err)
		}
		d.train = td
		if td.Source.Stats.Kinds[data.KindChat] > 0 {
			d.chat = chat
		}
		DescribeData(stderr, "data", td.Source, time.Since(t0))
		if td.Packed != nil {
			seq := int64(td.Packed.Seq())
			if n, pieces, err := td.Source.File.Longer(seq + 1); err != nil {
				return nil, fmt.Errorf("train: --data: %w", err)
			} else if n > 0 {
				fmt.Fprintf(stderr, "note: %s: %d examples are longer than seq_len %d (+1): each is split into pieces of %d columns, %d rows in all, a piece seeing nothing of the ones before it; a longer seq_len keeps them whole\n",
					path, n, seq, seq, pieces)
			}
		}
	}
	if path := o.EvalData; path != "" {
		t0 := time.Now()
		do.Splits = data.EvalSplits
		src, err := data.Open(path, do)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("train: --eval-data: %w", err)
		}
		d.evalSrc = src
		if d.eval, err = data.NewEvalSet(src, data.SeqLen(cfg)); err != nil {
			d.Close()
			return nil, fmt.Errorf("train: --eval-data: %w", err)
		}
		DescribeData(stderr, "eval data", src, time.Since(t0))
	}
	return d, nil
}

// DescribeData prints on w what a data file holds and how it is read
// (what: "data", "eval data"), tokenized in took.
func DescribeData(w io.Writer, what string, s *data.Source, took time.Duration) {
	st := s.Stats
	if st.Format == data.Text && s.File == nil {
		fmt.Fprintf(w, "%s: %s, raw text, %d tokens (one per byte), read in place in windows\n", what, s.Path, st.Tokens)
		return
	}
	format := st.Format.String()
	switch st.Format {
	case data.JSONL:
		format += fmt.Sprintf(", %d examples (%d text, %d prompt/completion, %d chat%s)", st.Examples,
			st.Kinds[data.KindText], st.Kinds[data.KindCompletion], st.Kinds[data.KindChat], chatConventions(st))
	case data.Parquet, data.Arrow:
		unit := map[data.Format]string{data.Parquet: "row groups", data.Arrow: "record batches"}[st.Format]
		split := ""
		if st.Split != "" {
			split = fmt.Sprintf(", split %s", st.Split)
		}
		format += fmt.Sprintf(" (%d files, %d %s%s), columns %s (%s), %d examples of %d rows", st.Files, st.Batches, unit, split,
			strings.Join(st.Columns, ", "), st.Convention, st.Examples, st.Rows)
	default:
		format += fmt.Sprintf(", %d examples", st.Examples)
	}
	fmt.Fprintf(w, "%s: %s, %s, %d tokens of which %d trained; token file %s (%d B/id), tokenized in %s\n",
		what, s.Path, format, st.Tokens, st.Trained,
		units.FormatBytes(st.Bytes), st.Width, took.Round(time.Millisecond))
	if st.Template != "" {
		fmt.Fprintf(w, "  chat template: %s\n", st.Template)
	}
	if m := st.SplitMarkers; len(m) > 0 {
		fmt.Fprintf(w, "note: %s: the chat template's ChatML markers %s are not tokens of the tokenizer: each is encoded as the tokens of its text; give the model's template with --chat-template, or start from a model whose tokenizer has them\n",
			s.Path, strings.Join(m, ", "))
	}
	if st.Nulls > 0 {
		fmt.Fprintf(w, "note: %s: %d rows had a null %s and were left out\n", s.Path, st.Nulls, strings.Join(st.Columns, " or "))
	}
	if st.Skipped > 0 {
		fmt.Fprintf(w, "note: %s: %d examples had no trained token and were left out\n", s.Path, st.Skipped)
	}
}

// chatConventions says which of a JSONL file's chats were ShareGPT's or
// Alpaca's ("" when none).
func chatConventions(st data.Stats) string {
	var parts []string
	for _, c := range []data.Convention{data.ConvShareGPT, data.ConvAlpaca} {
		if n := st.Conventions[c]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, c))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

// EpochSteps is the number of steps of epochs passes over the training
// data with global batches of cfg's train_batch_size rows: JSONL, the
// rows the epochs pack into (the last step reads on into the next epoch);
// raw text, as many windows of seq_len as it has tokens, per epoch.
func (d *Data) EpochSteps(cfg *config.Config, epochs int) (int, error) {
	g := int64(cfg.TrainBatchSize)
	var rows int64
	switch {
	case d.train == nil:
		return 0, inputf("train: --epochs needs --data (the synthetic corpus has no epochs)")
	case d.train.Packed != nil:
		var err error
		if rows, err = d.train.Packed.EpochStart(epochs); err != nil {
			return 0, fmt.Errorf("train: --epochs: %w", err)
		}
	default:
		rows = int64(epochs) * (d.train.Corpus.Len() / int64(data.SeqLen(cfg)))
	}
	steps := (rows + g - 1) / g
	if steps < 1 || steps > math.MaxInt32 {
		return 0, fmt.Errorf("train: --epochs %d: %d rows make %d steps of %d rows", epochs, rows, steps, g)
	}
	return int(steps), nil
}

// ChatTemplate is the chat template of the training data's {"messages"}
// examples, as a checkpoint records it; nil when it has none.
func (d *Data) ChatTemplate() *data.ChatTemplate {
	if d == nil {
		return nil
	}
	return d.chat
}

// evalDue says whether the held-out set is evaluated after step (of last).
func (d *Data) evalDue(step int64, last int) bool {
	if d == nil || d.eval == nil {
		return false
	}
	return step == int64(last) || (d.every > 0 && step%int64(d.every) == 0)
}

// evalHeldOut evaluates --eval-data after step and prints the result.
func evalHeldOut(e *engine.Engine, d *Data, step int64, w io.Writer) (*EvalLine, error) {
	// Not the run's context: a cancel during the evaluation still saves
	// the step it follows.
	st, err := e.Eval(context.Background(), d.eval)
	if err != nil {
		return nil, fmt.Errorf("train: eval after step %d: %w", step, err)
	}
	fmt.Fprintf(w, "eval after step %d: loss %.4f (ppl %.2f) over %d tokens of %s, %s\n",
		step, st.Loss, math.Exp(st.Loss), st.Tokens, d.evalSrc.Path, st.Duration.Round(time.Millisecond))
	return &EvalLine{Loss: st.Loss, Tokens: st.Tokens}, nil
}

// Identity is the identity of the training data as it was before it was
// opened (its size and SHA-256; a table's files), as every checkpoint
// records it; nil for the synthetic corpus.
func (d *Data) Identity() []checkpoint.DataFile {
	if d == nil {
		return nil
	}
	return d.ids
}

// NewData is the run data of training data opened by the caller
// (data.OpenTrainData), with no held-out set and no recorded identity;
// its Close closes train.
func NewData(train *data.TrainData) *Data { return &Data{train: train} }
