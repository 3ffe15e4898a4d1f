package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/strata-ai/strata/model"
)

// ErrEmptyCorpus says a data file has no bytes.
var ErrEmptyCorpus = errors.New("engine: data file is empty")

// OpenCorpus opens a data file (any bytes, one token per byte) to be read
// in windows (model.FileCorpus): memory does not grow with its size. A
// missing or empty file, or one that is not a regular file (a device such
// as /dev/zero, a pipe, a directory), is an error that names it.
func OpenCorpus(path string) (*model.FileCorpus, error) {
	c, err := model.OpenCorpus(path)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if c.Len() == 0 {
		c.Close()
		return nil, fmt.Errorf("%w: %s has no bytes to train on", ErrEmptyCorpus, path)
	}
	return c, nil
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

// syntheticCorpusBytes is the size of the built-in corpus.
const syntheticCorpusBytes = 64 << 10
