package data

import (
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// benchSource is a token file of 20000 examples of 40-800 tokens (about
// 8M tokens, bytes), its pages in the page cache.
func benchSource(b *testing.B) *Source {
	b.Helper()
	exs := testExamples(20000, 800, 256, 1)
	w, err := newTokenWriter(b.TempDir(), 256)
	if err != nil {
		b.Fatal(err)
	}
	for _, ex := range exs {
		if err := w.add(ex.ids, ex.train); err != nil {
			b.Fatal(err)
		}
	}
	tf, err := w.finish()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tf.Close() })
	ids := make([]int32, 1<<20)
	for off := int64(0); off < tf.Tokens(); off += int64(len(ids)) { // into the page cache
		n := min(int64(len(ids)), tf.Tokens()-off)
		tf.Read(off, ids[:n], nil)
	}
	return &Source{Path: filepath.Join(b.TempDir(), "bench"), File: tf}
}

// BenchmarkTokenFileExample reads random examples (span, ids and loss
// bits) from a token file in the page cache: the work a cache of
// tokenized examples would save (see the package doc).
func BenchmarkTokenFileExample(b *testing.B) {
	tf := benchSource(b).File
	rng := rand.New(rand.NewPCG(1, 2))
	ids, train := make([]int32, 1024), make([]bool, 1024)
	var toks int64
	for b.Loop() {
		s, e, err := tf.Span(rng.Int64N(tf.Examples()))
		if err != nil {
			b.Fatal(err)
		}
		if err := tf.Read(s, ids[:e-s], train[:e-s]); err != nil {
			b.Fatal(err)
		}
		toks += e - s
	}
	b.ReportMetric(float64(toks)/b.Elapsed().Seconds()/1e6, "Mtok/s")
}

// BenchmarkPackedRows packs rows of 2048 in a shuffled order, 8 at a time
// (a global batch): the data's share of a training step.
func BenchmarkPackedRows(b *testing.B) {
	p, err := NewPacked(benchSource(b).File, 2048, 1, true)
	if err != nil {
		b.Fatal(err)
	}
	var row int64
	for b.Loop() {
		if _, err := p.Rows(row, 8); err != nil {
			b.Fatal(err)
		}
		row += 8
	}
	b.ReportMetric(float64(row*2048)/b.Elapsed().Seconds()/1e6, "Mtok/s")
}
