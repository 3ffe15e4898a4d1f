package data

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
)

// A run's data: what a config's strata.data, seq_len and seed make of a
// data file (OpenTrainData), and the built-in text of a run without one
// (SyntheticCorpus). The engine reads the rows by global index; it opens
// strata.data itself when a library user gives no data.

// SeqLen is the row length of a run of cfg: strata.seq_len, else the
// max_seq_len of its strata.model (0 when the config names no shape: a
// library user's engine.Options.Model sets its own seq_len).
func SeqLen(cfg *config.Config) int {
	if cfg.Strata.SeqLen > 0 {
		return cfg.Strata.SeqLen
	}
	if s := cfg.Shape(); s != nil {
		return s.MaxSeq
	}
	return 0
}

// TrainData is a data file opened for a run: raw text (Source.Corpus,
// drawn from in random windows) or JSONL (Packed), handed to an engine
// (engine.Options.UseData). Close it after the engine.
type TrainData struct {
	*Source
	Packed *Packed // JSONL; nil for raw text
}

// OpenTrainData opens the data file at path for a run of cfg (Open,
// with o's tokenizer, chat template and token-file directory): raw text
// is read as windows, JSONL examples are packed into rows of the run's
// seq_len, in an order shuffled per epoch from strata.seed (file order
// without shuffle).
func OpenTrainData(path string, cfg *config.Config, o Options, shuffle bool) (*TrainData, error) {
	src, err := Open(path, o)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	d := &TrainData{Source: src}
	if src.Stats.Format.Examples() {
		if d.Packed, err = NewPacked(src.File, SeqLen(cfg), cfg.Strata.Seed, shuffle); err != nil {
			src.Close()
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	return d, nil
}

// SyntheticCorpus is the built-in training text of a run without data: about
// sizeBytes bytes of short English sentences drawn from a small grammar with
// a fixed seed, so a byte-level model learns its spelling and word order
// within a few dozen steps and the loss visibly goes down.
func SyntheticCorpus(sizeBytes int) []int32 {
	subjects := []string{"the cat", "a dog", "the old man", "my sister", "the engine", "a small bird", "the teacher", "our neighbour"}
	verbs := []string{"sees", "likes", "carries", "finds", "watches", "builds", "paints", "follows"}
	objects := []string{"the red ball", "a long road", "the green door", "two apples", "the river", "a quiet house", "the bright moon", "some bread"}
	endings := []string{" today.", " again.", " at night.", " in the morning.", ".", " with care.", " by the sea.", " every day."}
	rng := rand.New(rand.NewPCG(0x5a7a, 0x7ea1))
	var b strings.Builder
	for b.Len() < sizeBytes {
		s := subjects[rng.IntN(len(subjects))] + " " + verbs[rng.IntN(len(verbs))] + " " + objects[rng.IntN(len(objects))] + endings[rng.IntN(len(endings))]
		b.WriteString(strings.ToUpper(s[:1]) + s[1:])
		if rng.IntN(4) == 0 {
			b.WriteByte('\n')
		} else {
			b.WriteByte(' ')
		}
	}
	return model.Encode([]byte(b.String()))
}
