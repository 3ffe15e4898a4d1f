package engine

import (
	"fmt"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/model"
)

// Dataset is a source of packed training rows (data.Packed): row g of
// the run, by global index, the same for every rank and way of splitting
// the global batch. Step t (from 1) reads rows (t-1)·G .. (t-1)·G+G-1 with
// G = N·A·B, and rank r's micro-batch k is B rows from (t-1)·G + (r·A+k)·B,
// the split model.Sampler documents for raw windows.
type Dataset interface {
	// Seq is the row length; it must be the run's seq_len.
	Seq() int
	// Rows returns rows first .. first+n-1 as a batch of n rows.
	Rows(first int64, n int) (model.Batch, error)
}

// EvalSet is a held-out set of rows (data.EvalSet) that Eval reads whole;
// rows from Len on are padding without targets.
type EvalSet interface {
	Dataset
	// Len is the number of rows.
	Len() int64
}

// syntheticCorpusBytes is the size of the built-in corpus.
const syntheticCorpusBytes = 64 << 10

// batches is the engine's source of training rows: a model.Sampler of
// random windows over a raw corpus, or a Dataset of packed rows.
type batches struct {
	sampler *model.Sampler
	dataset Dataset
	checked bool            // every token was checked against the vocabulary at New (model.Tokens)
	file    *data.TrainData // the data New opened from strata.data, closed by Close; nil for data given in Options
}

// newBatches returns the sequence length and the source of rows:
// Options.Dataset, Options.Corpus, strata.data (opened with
// data.OpenTrainData, byte-level, shuffled; closed with the engine), or the
// synthetic corpus.
func newBatches(cfg *config.Config, m Model, opts Options) (int, *batches, error) {
	seq := cfg.Strata.SeqLen
	if seq == 0 {
		seq = m.MaxSeq()
	}
	if seq > m.MaxSeq() {
		return 0, nil, fmt.Errorf("engine: seq_len %d exceeds the model's max_seq_len %d", seq, m.MaxSeq())
	}
	b := &batches{}
	corpus := opts.Corpus
	switch {
	case opts.Dataset != nil:
		b.dataset = opts.Dataset
	case corpus != nil:
	case cfg.Strata.Data != "":
		d, err := data.OpenTrainData(cfg.Strata.Data, cfg, data.Options{}, true)
		if err != nil {
			return 0, nil, err
		}
		b.file = d
		if d.Packed != nil {
			b.dataset = d.Packed
		} else {
			corpus = d.Corpus
		}
	default:
		corpus = model.Tokens(data.SyntheticCorpus(syntheticCorpusBytes))
	}
	if b.dataset != nil {
		if b.dataset.Seq() != seq {
			b.close()
			return 0, nil, fmt.Errorf("engine: the dataset's rows are %d tokens, the run's seq_len is %d", b.dataset.Seq(), seq)
		}
		return seq, b, nil
	}
	if t, ok := corpus.(model.Tokens); ok {
		// Checked whole here; a corpus read in windows is checked a batch
		// at a time (readBatches).
		if err := model.CheckVocab(t, m.Vocab(), false); err != nil {
			return 0, nil, fmt.Errorf("engine: %w", err)
		}
		b.checked = true
	}
	s, err := model.NewCorpusSampler(corpus, seq, cfg.Strata.Seed)
	if err != nil {
		b.close()
		return 0, nil, fmt.Errorf("engine: data: %w", err)
	}
	b.sampler = s
	return seq, b, nil
}

// close closes the data file New opened, if any.
func (b *batches) close() error {
	if b == nil || b.file == nil {
		return nil
	}
	f := b.file
	b.file = nil
	return f.Close()
}

// rows returns rank rank's micro-batch micro of step (from 1): rows
// (rank·A+micro)·B onward of the step's global batch.
func (e *Engine) rows(step int64, rank, micro int) (model.Batch, error) {
	d := e.data
	first := (step-1)*int64(e.n*e.accum*e.micro) + int64((rank*e.accum+micro)*e.micro)
	var b model.Batch
	var err error
	if d.sampler != nil {
		b, err = d.sampler.RankBatch(int(step-1), rank, micro, e.accum, e.micro)
	} else {
		b, err = d.dataset.Rows(first, e.micro)
	}
	if err == nil && e.layout != nil && e.layout.LoRA != nil && e.layout.LoRA.Dropout > 0 {
		// LoRA's adapter dropout: the step's stream, the rows' global
		// indices (the same masks whatever the split into ranks).
		b.Dropout = &model.DropoutKey{Seed: model.DropoutStepSeed(e.cfg.Strata.Seed, step), FirstRow: first}
	}
	return b, err
}

// checkBatch checks a batch read in windows: its shape and vocabulary
// (model.Batch.Check).
func (e *Engine) checkBatch(b model.Batch) error { return b.Check(e.micro, e.seq, e.model.Vocab()) }
