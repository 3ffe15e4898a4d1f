package model

import (
	"errors"
	"fmt"

	"github.com/strata-ai/strata/shard"
)

// A model defined outside this package (a Go program's own architecture,
// trained by the engine through engine.Options.Model) describes its
// parameters with the same types as the built-in decoders: a Layout built
// by CustomLayout, and the Params calls of its passes as a list of Access
// (StackOrder writes the common one). Its passes reach parameter and
// gradient memory through Params, exactly as Model's do.

// CustomLayout lays out the parameters of a model defined outside this
// package: chunk c holds chunks[c].Tensors, packed densely in the order
// listed. Only each chunk's Name and its tensors' Name and Shape are read;
// Index, Offset and the lengths are computed. name names the model (in the
// engine's summary and in its checkpoints, which record it with every
// chunk's tensors); the Layout's Shape is zero. The tensor names must be
// unique over the layout, every dimension at least 1. The caller's slices
// are not kept.
func CustomLayout(name string, chunks []Chunk) (*Layout, error) {
	if name == "" {
		return nil, errors.New("model: a custom layout needs a name")
	}
	l := &Layout{Name: name, Chunks: make([]Chunk, len(chunks))}
	for c, in := range chunks {
		ch := Chunk{Index: c, Name: in.Name, Tensors: make([]Tensor, len(in.Tensors))}
		for i, t := range in.Tensors {
			n := 1
			for _, d := range t.Shape {
				n *= d
			}
			ch.Tensors[i] = Tensor{Name: t.Name, Shape: append([]int(nil), t.Shape...), Offset: ch.Len, Len: n}
			ch.Len += n
		}
		l.Chunks[c] = ch
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return l, nil
}

// Custom says whether l is a CustomLayout's: a model of no built-in
// architecture (its Shape is zero).
func (l *Layout) Custom() bool { return l.Shape == Shape{} }

// Validate checks the arrangement a trainer relies on: at least one chunk;
// chunk c has Index c, a name and at least one tensor; its tensors lie
// densely from offset 0 in the order listed, each as long as the product
// of its Shape (every dimension at least 1), and the chunk's Len is their
// sum; tensor names are not empty and unique over the layout.
func (l *Layout) Validate() error {
	if len(l.Chunks) == 0 {
		return fmt.Errorf("model: layout %q has no chunks", l.Name)
	}
	seen := map[string]int{}
	for c, ch := range l.Chunks {
		at := fmt.Sprintf("model: layout %q: chunk %d (%q)", l.Name, c, ch.Name)
		switch {
		case ch.Index != c:
			return fmt.Errorf("%s has index %d", at, ch.Index)
		case ch.Name == "":
			return fmt.Errorf("%s has no name", at)
		case len(ch.Tensors) == 0:
			return fmt.Errorf("%s has no tensors", at)
		}
		off := 0
		for _, t := range ch.Tensors {
			n := 1
			for _, d := range t.Shape {
				if d < 1 {
					return fmt.Errorf("%s: tensor %q has shape %v: every dimension must be >= 1", at, t.Name, t.Shape)
				}
				n *= d
			}
			switch prev, dup := seen[t.Name]; {
			case t.Name == "":
				return fmt.Errorf("%s: a tensor has no name", at)
			case dup:
				return fmt.Errorf("%s: tensor name %q is also chunk %d's", at, t.Name, prev)
			case len(t.Shape) == 0:
				return fmt.Errorf("%s: tensor %q has no shape", at, t.Name)
			case t.Offset != off || t.Len != n:
				return fmt.Errorf("%s: tensor %q at offset %d of %d elements, want offset %d (densely packed) of %d (shape %v)", at, t.Name, t.Offset, t.Len, off, n, t.Shape)
			}
			seen[t.Name] = c
			off += n
		}
		if ch.Len != off {
			return fmt.Errorf("%s has length %d, its tensors %d", at, ch.Len, off)
		}
	}
	return nil
}

// StackOrder is the access order (the Params calls of one micro-batch,
// Forward then Backward) of a model whose forward runs its chunks 0, 1,
// ..., n-1 in turn and whose backward runs them back, n-1 down to 0:
//
//	forward:   Acquire(c) Release(c)                       c = 0..n-1
//	backward:  Acquire(c) Grad(c) Release(c) GradReady(c)  c = n-1..0
func StackOrder(chunks int) []Access {
	a := make([]Access, 0, 6*chunks)
	for c := range chunks {
		a = append(a, Access{AccessAcquire, c, shard.Forward}, Access{AccessRelease, c, shard.Forward})
	}
	for c := chunks - 1; c >= 0; c-- {
		a = append(a, Access{AccessAcquire, c, shard.Backward}, Access{AccessGrad, c, shard.Backward},
			Access{AccessRelease, c, shard.Backward}, Access{AccessGradReady, c, shard.Backward})
	}
	return a
}
