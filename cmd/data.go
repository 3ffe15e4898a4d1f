package cmd

import (
	"context"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/hf"
	trainrun "github.com/strata-ai/strata/run"
	"github.com/strata-ai/strata/source"
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

// runChat is the chat template of {"messages"} lines: --chat-template,
// else the one a run recorded (recorded: a checkpoint's), else the one of
// the Hugging Face model the run started from, else ChatML. cmd names the
// command in errors (train, eval, generate).
func runChat(c *cli.Context, src *hf.Source, recorded *data.ChatTemplate, cmd string) (*data.ChatTemplate, error) {
	if p := c.String("chat-template"); p != "" {
		chat, err := data.LoadChatTemplate(p)
		if err != nil {
			return nil, fmt.Errorf("%s: --chat-template: %w", cmd, err)
		}
		return chat, nil
	}
	chat, err := source.ChatTemplate(src, recorded)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd, err)
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

// describeData prints what a data file holds and how it is read.
var describeData = trainrun.DescribeData

// openRunData opens strata.data and --eval-data for a run of cfg from
// source and says what they hold (trainrun.OpenData). ctx (the first signal)
// stops the tokenizing.
func openRunData(ctx context.Context, c *cli.Context, cfg *config.Config, source *hf.Source, stderr io.Writer) (*trainrun.Data, error) {
	o := trainrun.DataOptions{EvalData: c.String("eval-data"), EvalEvery: c.Int("eval-every"), NoShuffle: c.Bool("no-shuffle"),
		Out: c.String("out"), Source: source, DataGiven: c.IsSet("data")}
	if cfg.Strata.Data != "" || o.EvalData != "" {
		chat, err := runChat(c, source, nil, "train")
		if err != nil {
			return nil, err
		}
		o.Chat = chat
	}
	d, err := trainrun.OpenData(ctx, cfg, o, stderr)
	return d, runError(err)
}
