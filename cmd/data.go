package cmd

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

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/tokenizer"
)

// dataFlags are train's flags for what it trains on and evaluates.
func dataFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "data", Usage: "training data: raw text (random windows), JSONL (by extension .jsonl, else a first line that is such an object) or Parquet or Arrow (a file, a directory or a glob of shards, a datasets.save_to_disk directory: its train split), their examples ({\"text\"}, {\"prompt\", \"completion\"}, {\"messages\"}, ShareGPT's {\"conversations\"}, Alpaca's {\"instruction\", \"input\", \"output\"}) packed into rows (default: strata.data, else a built-in synthetic corpus)"},
		&cli.StringFlag{Name: "data-columns", Usage: "the names --data and --eval-data hold the examples' fields under, as FIELD=NAME pairs: \"messages=dialog\", \"prompt=question,completion=answer\", \"role=speaker,content=text\" (fields: text, prompt, completion, messages, conversations, instruction, input, output, system, role, content, from, value)"},
		&cli.StringFlag{Name: "eval-data", Usage: "held-out data (the same formats; a DatasetDict's validation split, else its test split): its mean loss over the target tokens after every --eval-every steps and at the end"},
		&cli.IntFlag{Name: "eval-every", Usage: "evaluate --eval-data every N steps (0: only at the end)"},
		&cli.IntFlag{Name: "epochs", Usage: "train N passes over the data instead of --steps (JSONL: its packed rows; raw text: as many windows as it has tokens)"},
		&cli.BoolFlag{Name: "no-shuffle", Usage: "JSONL: pack the examples in file order in every epoch (default: an order shuffled per epoch from strata.seed)"},
		&cli.StringFlag{Name: "chat-template", Usage: "the chat template of {\"messages\"} lines: a model directory (chat_template.jinja or tokenizer_config.json), a tokenizer_config.json or a .jinja file (default: ChatML)"},
	}
}

// runData is what a run trains on and evaluates.
type runData struct {
	train   *data.TrainData // nil: the synthetic corpus
	eval    *data.EvalSet   // nil: no --eval-data
	evalSrc *data.Source
	every   int
	// chat is the chat template of the training data's {"messages"}
	// lines, recorded in every checkpoint; nil when it has none.
	chat *data.ChatTemplate
}

// Close closes the data files.
func (d *runData) Close() {
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

// runChat is the chat template of {"messages"} lines: --chat-template,
// else the one a run recorded (recorded: a checkpoint's), else the one of
// the Hugging Face model the run started from, else ChatML. cmd names the
// command in errors (train, eval, generate).
func runChat(c *cli.Context, source *hf.Source, recorded *data.ChatTemplate, cmd string) (*data.ChatTemplate, error) {
	if p := c.String("chat-template"); p != "" {
		chat, err := data.LoadChatTemplate(p)
		if err != nil {
			return nil, fmt.Errorf("%s: --chat-template: %w", cmd, err)
		}
		return chat, nil
	}
	if recorded != nil {
		if recorded.Text() == data.ChatMLTemplate {
			return data.DefaultChatTemplate(), nil
		}
		chat, err := data.ParseChatTemplate(recorded.Text(), recorded.Source()+" (recorded by the run)", recorded.SpecialTokens())
		if err != nil {
			return nil, fmt.Errorf("%s: the run's chat template: %w", cmd, err)
		}
		return chat, nil
	}
	if source == nil || source.Format != hf.SourceHF {
		return data.DefaultChatTemplate(), nil
	}
	chat, err := data.LoadChatTemplate(source.Path)
	if errors.Is(err, fs.ErrNotExist) { // no tokenizer_config.json
		return data.DefaultChatTemplate(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: the model's chat template: %w", cmd, err)
	}
	return chat, nil
}

// checkDataFlags refuses data flags that do not go together.
func checkDataFlags(c *cli.Context) error {
	switch {
	case c.IsSet("epochs") && c.IsSet("steps"):
		return usagef("train: --epochs and --steps both say how long to train: give one")
	case c.IsSet("epochs") && c.Int("epochs") < 1:
		return usagef("train: --epochs %d: need at least 1", c.Int("epochs"))
	case c.Int("eval-every") < 0:
		return usagef("train: --eval-every %d: need 0 (only at the end) or more", c.Int("eval-every"))
	case c.IsSet("eval-every") && c.String("eval-data") == "":
		return usagef("train: --eval-every needs --eval-data FILE")
	}
	return nil
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

// openRunData opens strata.data and --eval-data for a run of cfg from
// source (data files are tokenized in one streaming pass with the model's
// tokenizer: JSONL always, raw text with a tokenizer other than bytes)
// and says what they hold. ctx (the first signal) stops the tokenizing.
func openRunData(ctx context.Context, c *cli.Context, cfg *config.Config, source *hf.Source, stderr io.Writer) (*runData, error) {
	d := &runData{every: c.Int("eval-every")}
	if cfg.Strata.Data == "" && c.String("eval-data") == "" {
		return d, nil
	}
	tok, tokName, err := runTokenizer(cfg, source)
	if err != nil {
		return nil, err
	}
	chat, err := runChat(c, source, nil, "train")
	if err != nil {
		return nil, err
	}
	cols, err := data.ParseColumns(cfg.Strata.DataColumns)
	if err != nil {
		return nil, usagef("train: --data-columns (strata.data_columns) %q: %v", cfg.Strata.DataColumns, err)
	}
	o := data.Options{Tokenizer: tok, Chat: chat, Dir: tokenDir(c.String("out")), Context: ctx, Columns: cols}
	fmt.Fprintf(stderr, "tokenizer: %s\n", tokName)
	if path := cfg.Strata.Data; path != "" {
		t0 := time.Now()
		td, err := data.OpenTrainData(path, cfg, o, !c.Bool("no-shuffle"))
		if err != nil && !c.IsSet("data") && !filepath.IsAbs(path) && errors.Is(err, fs.ErrNotExist) {
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
		describeData(stderr, "data", td.Source, time.Since(t0))
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
	if path := c.String("eval-data"); path != "" {
		t0 := time.Now()
		o.Splits = data.EvalSplits
		src, err := data.Open(path, o)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("train: --eval-data: %w", err)
		}
		d.evalSrc = src
		if d.eval, err = data.NewEvalSet(src, data.SeqLen(cfg)); err != nil {
			d.Close()
			return nil, fmt.Errorf("train: --eval-data: %w", err)
		}
		describeData(stderr, "eval data", src, time.Since(t0))
	}
	return d, nil
}

// describeData prints what a data file holds and how it is read.
func describeData(w io.Writer, what string, s *data.Source, took time.Duration) {
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

// epochSteps is the number of steps of epochs passes over the training
// data with global batches of cfg's train_batch_size rows: JSONL, the
// rows the epochs pack into (the last step reads on into the next epoch);
// raw text, as many windows of seq_len as it has tokens, per epoch.
func epochSteps(d *runData, cfg *config.Config, epochs int) (int, error) {
	g := int64(cfg.TrainBatchSize)
	var rows int64
	switch {
	case d.train == nil:
		return 0, usagef("train: --epochs needs --data (the synthetic corpus has no epochs)")
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

// chatTemplate is d.chat, nil for no data.
func (d *runData) chatTemplate() *data.ChatTemplate {
	if d == nil {
		return nil
	}
	return d.chat
}

// evalDue says whether the held-out set is evaluated after step (of last).
func (d *runData) evalDue(step int64, last int) bool {
	if d == nil || d.eval == nil {
		return false
	}
	return step == int64(last) || (d.every > 0 && step%int64(d.every) == 0)
}

// EvalLine is an evaluation of --eval-data in steps.jsonl and summary.json.
type EvalLine struct {
	Loss   float64 `json:"eval_loss"`
	Tokens int64   `json:"eval_tokens"`
}

// evalHeldOut evaluates --eval-data after step and prints the result.
func evalHeldOut(e *engine.Engine, d *runData, step int64, w io.Writer) (*EvalLine, error) {
	st, err := e.Eval(d.eval)
	if err != nil {
		return nil, fmt.Errorf("train: eval after step %d: %w", step, err)
	}
	fmt.Fprintf(w, "eval after step %d: loss %.4f (ppl %.2f) over %d tokens of %s, %s\n",
		step, st.Loss, math.Exp(st.Loss), st.Tokens, d.evalSrc.Path, st.Duration.Round(time.Millisecond))
	return &EvalLine{Loss: st.Loss, Tokens: st.Tokens}, nil
}
