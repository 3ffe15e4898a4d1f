package cmd

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/model"
)

// runJSONL evaluates a JSONL --data file as `strata train --eval-data`
// does: read by package data with the model's tokenizer and the chat
// template training would take (runChat: --chat-template, else the
// checkpoint's recorded one, else the Hugging Face source's), its examples packed in file order into rows of seq
// (data.EvalSet), the loss only on the tokens training learns from (the
// completions, the assistant's turns; model.IgnoreTarget elsewhere). Each
// example of a row (Batch.Pos restarts at 0) is scored from an empty
// cache, as the packed row's attention sees it alone.
func (e *evalRun) runJSONL(c *cli.Context) error {
	path := c.String("data")
	chat, err := runChat(c, e.m.source, e.m.recordedChat(), "eval")
	if err != nil {
		return err
	}
	var tok data.Tokenizer = e.m.tok
	if e.m.byteTok {
		tok = data.Bytes{} // as train reads data without a tokenizer.json
	}
	t0 := time.Now()
	src, err := openEvalExamples(c, path, data.Options{Tokenizer: tok, Chat: chat})
	if err != nil {
		return fmt.Errorf("eval: --data: %w", err)
	}
	defer src.Close()
	set, err := data.NewEvalSet(src, e.seq)
	if err != nil {
		return fmt.Errorf("eval: --data: %w", err)
	}
	describeData(e.stderr, "eval data", src, time.Since(t0))
	e.examples = src.Stats.Examples
	for r := range set.Len() {
		b, err := set.Rows(r, 1)
		if err != nil {
			return fmt.Errorf("eval: --data %s: row %d: %w", path, r, err)
		}
		for i := 0; i < len(b.IDs); {
			j := i + 1
			for j < len(b.IDs) && (b.Pos == nil || b.Pos[j] != 0) {
				j++
			}
			if hasTarget(b.Targets[i:j]) {
				if err := e.score(b.IDs[i:j], b.Targets[i:j]); err != nil {
					return err
				}
			}
			i = j
		}
		e.progressRows(r+1, set.Len(), path)
	}
	e.windows = set.Len() // rows, not the examples scored
	if e.counted != set.Targets() {
		return fmt.Errorf("eval: --data %s: scored %d tokens, the evaluation set holds %d targets", path, e.counted, set.Targets())
	}
	if e.counted == 0 {
		return fmt.Errorf("eval: --data %s: no trained token to predict", path)
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

// progressRows reports on stderr every evalProgressEvery.
func (e *evalRun) progressRows(done, rows int64, path string) {
	loss, due := e.progressDue()
	if !due {
		return
	}
	fmt.Fprintf(e.stderr, "eval: %d of %d rows of %s, %d tokens, loss so far %.4f\n", done, rows, path, e.counted, loss)
}

// openEvalExamples opens eval's --data as train's --eval-data is opened:
// under --data-columns' names, a DatasetDict's evaluation split.
func openEvalExamples(c *cli.Context, path string, o data.Options) (*data.Source, error) {
	cols, err := data.ParseColumns(c.String("data-columns"))
	if err != nil {
		return nil, usagef("eval: --data-columns: %v", err)
	}
	o.Columns, o.Splits = cols, data.EvalSplits
	return data.Open(path, o)
}
