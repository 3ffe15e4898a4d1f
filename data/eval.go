package data

import (
	"fmt"

	"github.com/strata-ai/strata/model"
)

// EvalSet is a held-out data file as a fixed list of rows, each read once
// per evaluation: JSONL examples packed in file order (one epoch, as
// Packed packs them), or raw text cut into consecutive windows (inputs
// t[s:s+seq], targets t[s+1:s+seq+1] for s = 0, seq, 2·seq, ...; the last
// window may be shorter, its row padded). Rows past Len are padding (no
// targets), so a caller may read whole batches.
type EvalSet struct {
	seq     int
	rows    int64
	targets int64
	packed  *Packed
	corpus  model.Corpus
}

// NewEvalSet makes the rows of s for rows of seq columns.
func NewEvalSet(s *Source, seq int) (*EvalSet, error) {
	if seq < 1 {
		return nil, fmt.Errorf("data: eval: seq %d must be >= 1", seq)
	}
	e := &EvalSet{seq: seq}
	if s.Stats.Format.Examples() {
		p, err := NewPacked(s.File, seq, 0, false)
		if err != nil {
			return nil, err
		}
		if e.rows, err = p.EpochStart(1); err != nil {
			return nil, err
		}
		e.packed, e.targets = p, s.Stats.Trained
		return e, nil
	}
	n := s.Corpus.Len()
	if n < 2 {
		return nil, fmt.Errorf("data: eval %s: %w: %d tokens", s.Path, ErrEmpty, n)
	}
	e.corpus, e.rows, e.targets = s.Corpus, (n-1+int64(seq)-1)/int64(seq), n-1
	return e, nil
}

// Seq is the row length.
func (e *EvalSet) Seq() int { return e.seq }

// Len is the number of rows.
func (e *EvalSet) Len() int64 { return e.rows }

// Targets is the number of targets over all rows: the tokens the
// evaluation's mean loss is over.
func (e *EvalSet) Targets() int64 { return e.targets }

// Rows returns rows first .. first+n-1; those past Len are padding.
func (e *EvalSet) Rows(first int64, n int) (model.Batch, error) {
	real := int(max(0, min(int64(n), e.rows-first)))
	if e.packed != nil && real > 0 {
		b, err := e.packed.Rows(first, real)
		if err != nil {
			return b, err
		}
		if real == n {
			return b, nil
		}
		out := emptyBatch(n, e.seq)
		copy(out.IDs, b.IDs)
		copy(out.Targets, b.Targets)
		copy(out.Pos, b.Pos)
		return out, nil
	}
	b := emptyBatch(n, e.seq)
	if e.corpus == nil {
		return b, nil
	}
	b.Pos = nil // one window a row; the padding after it changes nothing
	win := make([]int32, e.seq+1)
	for r := range real {
		s := (first + int64(r)) * int64(e.seq)
		k := min(int64(e.seq), e.corpus.Len()-1-s)
		if err := e.corpus.Read(s, win[:k+1]); err != nil {
			return model.Batch{}, err
		}
		copy(b.IDs[r*e.seq:], win[:k])
		copy(b.Targets[r*e.seq:], win[1:k+1])
	}
	return b, nil
}
