package estimate

import (
	"fmt"
	"path"
	"strings"

	"github.com/strata-ai/strata/model"
)

// globChars are the characters that make a strata.freeze pattern a glob.
const globChars = "*?["

// matchTensor says whether pattern matches the tensor name: a pattern
// with any of * ? [ is a path.Match glob over the whole name, any other a
// substring of it.
func matchTensor(pattern, name string) (bool, error) {
	if !strings.ContainsAny(pattern, globChars) {
		return strings.Contains(name, pattern), nil
	}
	ok, err := path.Match(pattern, name)
	if err != nil {
		return false, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	return ok, nil
}

// FrozenChunks resolves strata.freeze's patterns over l's tensor names:
// frozen[c] says whether chunk c is frozen (nil when no pattern is given).
// A pattern without any of * ? [ matches the tensors whose name contains
// it ("layers.0." is layer 0's tensors, not layer 10's); one with them is a
// path.Match glob over the whole name ("h.[0-3].*"). It refuses a pattern
// that matches no tensor (naming it and a few real names), patterns that
// cover part of a chunk (one error naming each such chunk and the tensors
// left out), and patterns that freeze every chunk (nothing would train).
func FrozenChunks(l *model.Layout, patterns []string) ([]bool, error) {
	if l.LoRA != nil { // LoRA: the base is frozen, the adapters train (the config refuses strata.freeze beside it)
		frozen := make([]bool, len(l.Chunks))
		for c := range frozen {
			frozen[c] = !l.IsAdapter(c)
		}
		return frozen, nil
	}
	if len(patterns) == 0 {
		return nil, nil
	}
	used := make([]bool, len(patterns))
	frozen := make([]bool, len(l.Chunks))
	var partial []string
	for c, ch := range l.Chunks {
		var in, out []string
		for _, t := range ch.Tensors {
			hit := false
			for i, p := range patterns {
				ok, err := matchTensor(p, t.Name)
				if err != nil {
					return nil, fmt.Errorf("engine: strata.freeze: %w", err)
				}
				if ok {
					used[i], hit = true, true
				}
			}
			if hit {
				in = append(in, t.Name)
			} else {
				out = append(out, t.Name)
			}
		}
		switch {
		case len(in) == 0:
		case len(out) == 0:
			frozen[c] = true
		default:
			partial = append(partial, fmt.Sprintf("chunk %q: the patterns match %s but not %s", ch.Name, nameList(in, 4), nameList(out, 8)))
		}
	}
	for i, p := range patterns {
		if !used[i] {
			return nil, fmt.Errorf("engine: strata.freeze: pattern %q matches no tensor of %s (its tensors are named like %s; a pattern without * ? [ matches the names that contain it, one with them is a glob over the whole name)",
				p, l.Name, exampleNames(l))
		}
	}
	if len(partial) > 0 {
		more := ""
		if len(partial) > 3 {
			partial, more = partial[:3], fmt.Sprintf("; and %d more chunks alike", len(partial)-3)
		}
		return nil, fmt.Errorf("engine: strata.freeze: a chunk (the unit of optimizer state) is frozen whole or not at all; %s%s: add patterns for the rest of each chunk, or drop the ones that match part of it",
			strings.Join(partial, "; "), more)
	}
	for _, f := range frozen {
		if !f {
			return frozen, nil
		}
	}
	return nil, fmt.Errorf("engine: strata.freeze %q freezes every chunk of %s: nothing would train", patterns, l.Name)
}

// nameList writes up to max names, then how many more.
func nameList(names []string, max int) string {
	if len(names) <= max {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:max], ", "), len(names)-max)
}

// exampleNames lists a few of l's tensor names: the first chunk's, the
// first block's first ones, the last chunk's.
func exampleNames(l *model.Layout) string {
	var names []string
	last := len(l.Chunks) - 1
	for c, ch := range l.Chunks {
		if c > 1 && c < last {
			continue
		}
		for i, t := range ch.Tensors {
			if c == 1 && i >= 3 {
				names = append(names, "…")
				break
			}
			names = append(names, t.Name)
		}
	}
	return strings.Join(names, ", ")
}

// FrozenParams is the number of parameters in the frozen chunks.
func FrozenParams(l *model.Layout, frozen []bool) int64 {
	var n int64
	for c, f := range frozen {
		if f {
			n += int64(l.Chunks[c].Len)
		}
	}
	return n
}

// DescribeChunks names the chunks where mask is true, consecutive blocks as
// one range: "embeddings, blocks 0-5, ln_f".
func DescribeChunks(l *model.Layout, mask []bool) string {
	var parts []string
	for c := 0; c < len(mask); c++ {
		if !mask[c] {
			continue
		}
		if l.IsExpert(c) {
			end := c
			for end+1 < len(mask) && mask[end+1] && l.IsExpert(end+1) {
				end++
			}
			parts = append(parts, describeExperts(l, c, end)...)
			c = end
			continue
		}
		end := c
		for end+1 < len(mask) && mask[end+1] && end+1 <= l.Shape.Layers && c >= model.BlockChunk(0) {
			end++
		}
		if end == c {
			parts = append(parts, l.Chunks[c].Name)
			continue
		}
		parts = append(parts, fmt.Sprintf("blocks %d-%d", c-model.BlockChunk(0), end-model.BlockChunk(0)))
		c = end
	}
	return strings.Join(parts, ", ")
}

// describeExperts names the expert chunks first..last (consecutive): the
// sparse layers whose experts are all among them as one range ("the 128
// experts of blocks 0-47"), the others by layer ("block 3 experts
// 0-5", or a chunk's own name).
func describeExperts(l *model.Layout, first, last int) []string {
	ne := l.Shape.Experts
	var parts []string
	fullFrom, fullTo := -1, -1
	flush := func() {
		switch {
		case fullFrom < 0:
		case fullFrom == fullTo:
			parts = append(parts, fmt.Sprintf("the %d experts of block %d", ne, fullFrom))
		default:
			parts = append(parts, fmt.Sprintf("the %d experts of blocks %d-%d", ne, fullFrom, fullTo))
		}
		fullFrom, fullTo = -1, -1
	}
	for c := first; c <= last; {
		layer := l.ChunkLayer(c)
		e0 := c - l.ExpertChunk(layer, 0)
		e1 := min(ne-1, e0+last-c)
		if e0 == 0 && e1 == ne-1 {
			if fullFrom < 0 {
				fullFrom = layer
			}
			fullTo = layer
		} else {
			flush()
			if e0 == e1 {
				parts = append(parts, l.Chunks[c].Name)
			} else {
				parts = append(parts, fmt.Sprintf("block %d experts %d-%d", layer, e0, e1))
			}
		}
		c += e1 - e0 + 1
	}
	flush()
	return parts
}
