package data

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-ai/strata/model"
)

// testExamples is n examples of random lengths 2 .. maxLen over vocab
// ids, with random loss bits (each example keeps at least one trained
// target).
func testExamples(n, maxLen, vocab int, seed uint64) []example {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]example, n)
	for i := range out {
		l := 2 + rng.IntN(maxLen-1)
		ex := example{ids: make([]int32, l), train: make([]bool, l)}
		for j := range l {
			ex.ids[j] = int32(rng.IntN(vocab))
			ex.train[j] = rng.IntN(3) > 0
		}
		ex.train[1+rng.IntN(l-1)] = true
		out[i] = ex
	}
	return out
}

// writeTokens writes examples to a token file.
func writeTokens(t *testing.T, exs []example, vocab int) *TokenFile {
	t.Helper()
	w, err := newTokenWriter(t.TempDir(), vocab)
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range exs {
		if err := w.add(ex.ids, ex.train); err != nil {
			t.Fatal(err)
		}
	}
	tf, err := w.finish()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tf.Close() })
	return tf
}

// TestTokenFileWidths: ids and loss bits read back as written, at the
// width the vocabulary needs (1, 2, 4 bytes), from any offset.
func TestTokenFileWidths(t *testing.T) {
	for _, c := range []struct{ vocab, width int }{{256, 1}, {257, 2}, {65536, 2}, {65537, 4}, {152064, 4}} {
		exs := testExamples(300, 40, c.vocab, uint64(c.vocab))
		exs[0].ids[0] = int32(c.vocab - 1) // the largest id survives
		tf := writeTokens(t, exs, c.vocab)
		if tf.Width() != c.width || tf.Examples() != int64(len(exs)) {
			t.Fatalf("vocab %d: width %d, %d examples", c.vocab, tf.Width(), tf.Examples())
		}
		var all example
		for i, ex := range exs {
			s, e, err := tf.Span(int64(i))
			if err != nil || s != int64(len(all.ids)) || e-s != int64(len(ex.ids)) {
				t.Fatalf("vocab %d example %d: span %d..%d %v, want %d..+%d", c.vocab, i, s, e, err, len(all.ids), len(ex.ids))
			}
			all.add(ex.ids, false)
			copy(all.train[len(all.train)-len(ex.ids):], ex.train)
		}
		for _, off := range []int{0, 1, 7, 8, 13, len(all.ids) - 17} {
			ids, train := make([]int32, 17), make([]bool, 17)
			if err := tf.Read(int64(off), ids, train); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids, all.ids[off:off+17]) || !slices.Equal(train, all.train[off:off+17]) {
				t.Fatalf("vocab %d: tokens at %d read back differently", c.vocab, off)
			}
		}
		if err := tf.Read(int64(len(all.ids)-3), make([]int32, 4), nil); err == nil {
			t.Errorf("vocab %d: a read past the end did not fail", c.vocab)
		}
	}
}

// piece is one example's piece as a row holds it.
type piece struct {
	ex, from int // example and its first token
	cols     int
}

// checkRow checks that row r of b holds exactly pieces (in order) of exs,
// with positions restarting at each, targets where the loss bit is set
// and nowhere else (not across an example's end, not in padding).
func checkRow(t *testing.T, b model.Batch, r int, pieces []piece, exs []example) {
	t.Helper()
	col := 0
	for _, p := range pieces {
		ex := exs[p.ex]
		for j := range p.cols {
			i := r*b.Seq + col + j
			tok := p.from + j
			want := int32(model.IgnoreTarget)
			if ex.train[tok+1] {
				want = ex.ids[tok+1]
			}
			if b.IDs[i] != ex.ids[tok] || b.Targets[i] != want || b.Pos[i] != int32(j) {
				t.Fatalf("row %d col %d (example %d token %d): id %d target %d pos %d, want %d %d %d",
					r, col+j, p.ex, tok, b.IDs[i], b.Targets[i], b.Pos[i], ex.ids[tok], want, j)
			}
		}
		col += p.cols
	}
	for j := col; j < b.Seq; j++ {
		i := r*b.Seq + j
		if b.Targets[i] != model.IgnoreTarget || b.Pos[i] != int32(j-col) {
			t.Fatalf("row %d padding col %d: target %d pos %d", r, j, b.Targets[i], b.Pos[i])
		}
	}
}

// packRef is the reference packing of one epoch: examples in order, next
// fit, long ones split into pieces of seq columns.
func packRef(order []int, exs []example, seq int) [][]piece {
	var rows [][]piece
	var row []piece
	used := 0
	for _, e := range order {
		cols := len(exs[e].ids) - 1
		for from := 0; from < cols; from += seq {
			c := min(seq, cols-from)
			if used+c > seq {
				rows, row, used = append(rows, row), nil, 0
			}
			row = append(row, piece{e, from, c})
			used += c
		}
	}
	return append(rows, row)
}

// TestPacked: rows of two epochs equal a reference next-fit packing of
// the examples in each epoch's order (a permutation, different per
// epoch, file order without shuffle), with positions, targets and padding
// as documented; and every way of reading them (whole, in pieces, out of
// order, from a fresh Packed as a resumed run does) gives the same rows.
func TestPacked(t *testing.T) {
	const seq = 16
	exs := testExamples(97, 40, 300, 7) // lengths up to 40: many split
	tf := writeTokens(t, exs, 300)
	for _, shuffle := range []bool{false, true} {
		p, err := NewPacked(tf, seq, 11, shuffle)
		if err != nil {
			t.Fatal(err)
		}
		var orders [][]int
		for e := range 2 {
			order := make([]int, len(exs))
			for i := range order {
				order[i] = int(p.order(e, int64(i)))
			}
			sorted := slices.Clone(order)
			slices.Sort(sorted)
			for i, v := range sorted {
				if v != i {
					t.Fatalf("epoch %d order is not a permutation", e)
				}
			}
			if !shuffle && !slices.Equal(order, sorted) {
				t.Fatalf("no shuffle: epoch %d is not in file order", e)
			}
			orders = append(orders, order)
		}
		if shuffle && slices.Equal(orders[0], orders[1]) {
			t.Fatal("epochs 0 and 1 have the same order")
		}
		var want [][]piece
		var epochRows []int64
		for _, o := range orders {
			rows := packRef(o, exs, seq)
			epochRows = append(epochRows, int64(len(rows)))
			want = append(want, rows...)
		}
		if s1, err := p.EpochStart(1); err != nil || s1 != epochRows[0] {
			t.Fatalf("EpochStart(1) = %d %v, want %d", s1, err, epochRows[0])
		}
		total := len(want)
		whole, err := p.Rows(0, total)
		if err != nil {
			t.Fatal(err)
		}
		for r := range total {
			checkRow(t, whole, r, want[r], exs)
		}
		// In pieces of 3 rows, last piece first, then from a fresh Packed
		// starting in the second epoch.
		for first := (total - 1) / 3 * 3; first >= 0; first -= 3 {
			n := min(3, total-first)
			part, err := p.Rows(int64(first), n)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(part.IDs, whole.IDs[first*seq:(first+n)*seq]) || !slices.Equal(part.Targets, whole.Targets[first*seq:(first+n)*seq]) || !slices.Equal(part.Pos, whole.Pos[first*seq:(first+n)*seq]) {
				t.Fatalf("shuffle %v: rows %d..%d read alone differ from the whole read", shuffle, first, first+n-1)
			}
		}
		fresh, _ := NewPacked(tf, seq, 11, shuffle)
		late, err := fresh.Rows(int64(total-2), 2)
		if err != nil || !slices.Equal(late.IDs, whole.IDs[(total-2)*seq:]) || !slices.Equal(late.Targets, whole.Targets[(total-2)*seq:]) {
			t.Fatalf("shuffle %v: the last rows read first by a fresh Packed differ (%v)", shuffle, err)
		}
	}
}

// TestPackedSeedDecides: the same seed gives the same rows, another seed
// other rows.
func TestPackedSeedDecides(t *testing.T) {
	tf := writeTokens(t, testExamples(50, 10, 256, 3), 256)
	rows := func(seed uint64) []int32 {
		p, _ := NewPacked(tf, 32, seed, true)
		b, err := p.Rows(0, 8)
		if err != nil {
			t.Fatal(err)
		}
		return b.IDs
	}
	if !slices.Equal(rows(1), rows(1)) || slices.Equal(rows(1), rows(2)) {
		t.Error("rows do not follow the seed")
	}
}

// TestPermBijection: the Feistel permutation is a bijection of [0, n) for
// sizes around powers of two, and differs between epochs and seeds.
func TestPermBijection(t *testing.T) {
	for _, n := range []int64{1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 257, 1000, 4097, 65537} {
		seen := make([]bool, n)
		p := newPerm(n, 5, 3)
		for i := range n {
			j := p.at(i)
			if j < 0 || j >= n || seen[j] {
				t.Fatalf("n %d: %d -> %d is not a bijection", n, i, j)
			}
			seen[j] = true
		}
	}
	a, b, c := newPerm(1000, 1, 0), newPerm(1000, 1, 1), newPerm(1000, 2, 0)
	same := func(x, y perm) bool {
		for i := range int64(1000) {
			if x.at(i) != y.at(i) {
				return false
			}
		}
		return true
	}
	if same(a, b) || same(a, c) {
		t.Error("the permutation does not change with the epoch or the seed")
	}
}

// TestEvalSet: JSONL rows are the examples in file order, once; raw text
// is cut into consecutive windows, the last one shorter; rows past Len
// are padding; Targets counts what the rows hold.
func TestEvalSet(t *testing.T) {
	p := writeFile(t, "held.jsonl", `{"prompt": "ab", "completion": "cd"}`+"\n"+`{"text": "xyz"}`+"\n")
	src, err := Open(p, Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	e, err := NewEvalSet(src, 8)
	if err != nil {
		t.Fatal(err)
	}
	// "abcd": 3 columns (targets b? no, c, d); "xyz": 2 columns: one row of 8.
	b, err := e.Rows(0, 2)
	if err != nil || e.Len() != 1 {
		t.Fatalf("rows %d %v", e.Len(), err)
	}
	wantT := []int32{-1, 'c', 'd', 'y', 'z', -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
	wantP := []int32{0, 1, 2, 0, 1, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7}
	if !slices.Equal(b.Targets, wantT) || !slices.Equal(b.Pos, wantP) || !slices.Equal(b.IDs[:5], []int32{'a', 'b', 'c', 'x', 'y'}) {
		t.Fatalf("JSONL eval rows: ids %v targets %v pos %v", b.IDs, b.Targets, b.Pos)
	}
	if e.Targets() != 4 {
		t.Errorf("JSONL eval targets %d, want 4", e.Targets())
	}
	txt := writeFile(t, "held.txt", "0123456789")
	ts, err := Open(txt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	w, err := NewEvalSet(ts, 4)
	if err != nil {
		t.Fatal(err)
	}
	b, err = w.Rows(0, 4)
	if err != nil || w.Len() != 3 || w.Targets() != 9 {
		t.Fatalf("text eval: %d rows, %d targets, %v", w.Len(), w.Targets(), err)
	}
	wantI := []int32{'0', '1', '2', '3', '4', '5', '6', '7', '8', 0, 0, 0, 0, 0, 0, 0}
	wantT = []int32{'1', '2', '3', '4', '5', '6', '7', '8', '9', -1, -1, -1, -1, -1, -1, -1}
	if !slices.Equal(b.IDs, wantI) || !slices.Equal(b.Targets, wantT) || b.Pos != nil {
		t.Fatalf("text eval rows: ids %v targets %v pos %v", b.IDs, b.Targets, b.Pos)
	}
}

// TestTokenFileLonger: the examples longer than seq+1 tokens and the rows
// of seq columns they split into, counted over an offset table read in
// blocks (more examples than one block), equal a count example by example.
func TestTokenFileLonger(t *testing.T) {
	const seq = 16
	exs := testExamples(20000, 60, 300, 3)
	tf := writeTokens(t, exs, 300)
	var want, wantPieces int64
	for _, ex := range exs {
		if len(ex.ids) > seq+1 {
			want++
			for cols := len(ex.ids) - 1; cols > 0; cols -= seq {
				wantPieces++
			}
		}
	}
	n, pieces, err := tf.Longer(seq + 1)
	if err != nil || n != want || pieces != wantPieces || want == 0 {
		t.Errorf("Longer(%d): %d examples in %d pieces (%v), want %d in %d", seq+1, n, pieces, err, want, wantPieces)
	}
}
