package model

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// ByteVocab is the vocabulary of the byte-level tokenizer.
const ByteVocab = 256

// Encode turns text into token ids, one per byte: any file is training data.
func Encode(text []byte) []int32 {
	ids := make([]int32, len(text))
	for i, b := range text {
		ids[i] = int32(b)
	}
	return ids
}

// Decode turns byte-level token ids back into text; an id outside [0, 256)
// is an error.
func Decode(ids []int32) ([]byte, error) {
	out := make([]byte, len(ids))
	for i, id := range ids {
		if id < 0 || id >= ByteVocab {
			return nil, fmt.Errorf("model: token %d: id %d is not a byte", i, id)
		}
		out[i] = byte(id)
	}
	return out, nil
}

// Batch is one micro-batch: Rows sequences of Seq tokens, row-major.
// Targets[i] is the token that follows IDs[i] in the corpus, or IgnoreTarget
// where the loss leaves token i out (a prompt token, padding): it then
// contributes nothing to the loss or the gradient, and the micro-batch's
// loss is the mean over the tokens that have a target.
//
// Pos, when not nil, is each token's position within its example: a packed
// row holds several examples, example e starting at column s_e has
// positions 0, 1, ... from s_e on, and a token attends only to the tokens
// of its own example (query i sees keys i-Pos[i] .. i of its row). Nil
// means one example per row: Pos[i] is i's column.
type Batch struct {
	Rows, Seq    int
	IDs, Targets []int32
	Pos          []int32
	// Dropout seeds the dropout of a training micro-batch (LoRA's adapter
	// dropout, LoRA.Dropout); nil: none (an evaluation).
	Dropout *DropoutKey
}

// Check says what is wrong with b against the shape rows × seq and the
// vocabulary [0, vocab): ids and targets in it (targets may be
// IgnoreTarget), positions within their row.
func (b Batch) Check(rows, seq, vocab int) error {
	if b.Rows != rows || b.Seq != seq || len(b.IDs) != rows*seq || len(b.Targets) != len(b.IDs) || (b.Pos != nil && len(b.Pos) != len(b.IDs)) {
		return fmt.Errorf("the data gave a batch of %d×%d (%d ids, %d targets, %d positions), want %d×%d", b.Rows, b.Seq, len(b.IDs), len(b.Targets), len(b.Pos), rows, seq)
	}
	if err := CheckVocab(b.IDs, vocab, false); err != nil {
		return err
	}
	if err := CheckVocab(b.Targets, vocab, true); err != nil {
		return err
	}
	for i, p := range b.Pos {
		if p < 0 || int(p) > i%seq {
			return fmt.Errorf("token %d has position %d: a position is at most its column (%d)", i, p, i%seq)
		}
	}
	return nil
}

// CheckVocab says which token of tokens is outside the vocabulary
// [0, vocab) (IgnoreTarget allowed when ignore).
func CheckVocab(tokens []int32, vocab int, ignore bool) error {
	for i, t := range tokens {
		if (t < 0 || int(t) >= vocab) && !(ignore && t == IgnoreTarget) {
			return fmt.Errorf("token %d (id %d) is outside the vocabulary [0, %d)", i, t, vocab)
		}
	}
	return nil
}

// DropoutKey is where a micro-batch's dropout masks come from: Seed is the
// step's, FirstRow the global index of the batch's first row. An element's
// decision depends on (Seed, block, module, its row's global index, its
// position), never on how the global batch is split into micro-batches and
// ranks (gpu.DropoutKeep).
type DropoutKey struct {
	Seed     uint64
	FirstRow int64
}

// DropoutStepSeed is the DropoutKey seed of step (1 for the first) of a
// run of seed (strata.seed): a splitmix64 of seed and step.
func DropoutStepSeed(seed uint64, step int64) uint64 {
	z := seed + uint64(step)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// IgnoreTarget marks a token without a target (Batch.Targets).
const IgnoreTarget = -1

// Sampler draws training windows from a tokenized corpus, deterministically:
// the window of row r of step t depends only on (seed, t, r), never on the
// order of calls, so every run, every rank and every way of splitting a
// global batch see the same data, and the same text gives the same windows
// whether it is held in memory (Tokens) or read from a file (FileCorpus).
//
// A step's global batch is rows 0..G-1. Split across N ranks with A
// micro-batches of B rows each (G = N·A·B), rank r's micro-batch k is rows
// (r·A + k)·B .. (r·A + k + 1)·B - 1 (RankBatch): the ranks' micro-batches
// in rank order are the global batch in row order.
type Sampler struct {
	corpus Corpus
	len    int64 // corpus.Len()
	seq    int
	seed   uint64
}

// ErrCorpusTooShort says a corpus has fewer than seq+1 tokens.
var ErrCorpusTooShort = errors.New("model: corpus too short")

// NewSampler samples windows of seq tokens (plus the next token as the
// last target) from tokens. It keeps tokens without copying.
func NewSampler(tokens []int32, seq int, seed uint64) (*Sampler, error) {
	return NewCorpusSampler(Tokens(tokens), seq, seed)
}

// NewCorpusSampler samples windows of seq tokens (plus the next token as
// the last target) from c, reading each when a batch asks for it.
func NewCorpusSampler(c Corpus, seq int, seed uint64) (*Sampler, error) {
	if seq < 1 {
		return nil, fmt.Errorf("model: sampler seq %d must be >= 1", seq)
	}
	if n := c.Len(); n < int64(seq)+1 {
		return nil, fmt.Errorf("%w: %d tokens, need at least seq+1 = %d", ErrCorpusTooShort, n, seq+1)
	}
	return &Sampler{corpus: c, len: c.Len(), seq: seq, seed: seed}, nil
}

// Corpus returns the corpus the sampler reads.
func (s *Sampler) Corpus() Corpus { return s.corpus }

// Seq returns the window length.
func (s *Sampler) Seq() int { return s.seq }

// Window returns the first token index of row row of step step.
func (s *Sampler) Window(step, row int) int64 {
	rng := rand.New(rand.NewPCG(s.seed, uint64(step)<<32^uint64(uint32(row))))
	return rng.Int64N(s.len - int64(s.seq))
}

// Batch returns rows firstRow .. firstRow+rows-1 of step step: for each
// row, one read of its seq+1 tokens. A read error is returned as the
// corpus gives it (a FileCorpus names the file and the offset).
func (s *Sampler) Batch(step, firstRow, rows int) (Batch, error) {
	b := Batch{Rows: rows, Seq: s.seq, IDs: make([]int32, rows*s.seq), Targets: make([]int32, rows*s.seq)}
	win := make([]int32, s.seq+1)
	for r := 0; r < rows; r++ {
		if err := s.corpus.Read(s.Window(step, firstRow+r), win); err != nil {
			return Batch{}, err
		}
		copy(b.IDs[r*s.seq:(r+1)*s.seq], win[:s.seq])
		copy(b.Targets[r*s.seq:(r+1)*s.seq], win[1:])
	}
	return b, nil
}

// RankBatch returns micro-batch micro (0 <= micro < accum) of rank rank for
// step step, microRows rows each: rows (rank·accum + micro)·microRows onward.
func (s *Sampler) RankBatch(step, rank, micro, accum, microRows int) (Batch, error) {
	if micro < 0 || micro >= accum || rank < 0 {
		panic(fmt.Sprintf("model: RankBatch rank %d micro %d of %d", rank, micro, accum))
	}
	return s.Batch(step, (rank*accum+micro)*microRows, microRows)
}
