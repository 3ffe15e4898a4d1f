package data

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/strata-ai/strata/model"
)

// Packed draws training rows from a token file of examples: every epoch
// takes the examples in an order shuffled from (seed, epoch) (or file
// order) and packs them greedily, one after another, into rows of seq
// columns (next fit: an example that does not fit in what is left of a
// row starts the next one; the rest of the row is padding). An example of
// L tokens takes L-1 columns (inputs x0..x(L-2), targets x1..x(L-1));
// one longer than seq+1 tokens is split into pieces of seq+1 tokens that
// overlap by one (no target is lost), each filling a row of its own and
// starting at position 0 (a piece sees nothing of the pieces before it).
// Batch.Pos restarts at 0 with each example, piece and the padding; a
// target is model.IgnoreTarget where its token's loss bit is clear, at
// the last token of an example and in padding, so no target crosses an
// example's end.
//
// Row g (a global index: step t's global batch of G rows is rows t·G ..
// t·G+G-1) depends only on (file, seq, seed, shuffle, g): every rank, stage
// and way of splitting a global batch reads the same rows, and a resumed
// run reads what the uninterrupted one read. Epochs follow each other
// without end; Rows reads forward from a cursor (a seek back restarts at
// the epoch's start, counting rows from the examples' lengths).
type Packed struct {
	tf      *TokenFile
	seq     int
	seed    uint64
	shuffle bool

	mu     sync.Mutex
	cur    cursor
	starts []int64 // starts[e]: the first row of epoch e, for every epoch reached
	perm   perm    // the order of epoch perm.epoch
	// scratch of fill, reused (under mu)
	ids   []int32
	train []bool
	bytes []byte
}

// cursor is where the next row of a Packed begins.
type cursor struct {
	epoch int
	row   int64 // global index of the next row
	p     int64 // position in the epoch's order of the next example
	piece int64 // the token of that example the next piece starts at
}

// NewPacked packs the examples of tf into rows of seq columns.
func NewPacked(tf *TokenFile, seq int, seed uint64, shuffle bool) (*Packed, error) {
	switch {
	case seq < 1:
		return nil, fmt.Errorf("data: pack: seq %d must be >= 1", seq)
	case tf.Examples() == 0:
		return nil, fmt.Errorf("data: pack: %s has no examples", tf.name)
	}
	p := &Packed{tf: tf, seq: seq, seed: seed, shuffle: shuffle, starts: []int64{0}}
	p.perm = newPerm(tf.Examples(), seed, 0)
	return p, nil
}

// Seq is the row length.
func (p *Packed) Seq() int { return p.seq }

// Shuffled says whether epochs are shuffled.
func (p *Packed) Shuffled() bool { return p.shuffle }

// order is the example at position i of epoch e.
func (p *Packed) order(e int, i int64) int64 {
	if !p.shuffle {
		return i
	}
	if p.perm.epoch != e {
		p.perm = newPerm(p.tf.Examples(), p.seed, e)
	}
	return p.perm.at(i)
}

// EpochStart is the global index of epoch e's first row: the rows of
// epochs 0 .. e-1 together. It counts the rows of each epoch not yet
// reached (a pass over the examples' lengths).
func (p *Packed) EpochStart(e int) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.starts) <= e {
		c := cursor{epoch: len(p.starts) - 1, row: p.starts[len(p.starts)-1]}
		for c.epoch == len(p.starts)-1 {
			if err := p.next(&c, nil, 0); err != nil {
				return 0, err
			}
			if c.p == p.tf.Examples() && c.piece == 0 { // the epoch's last row is done
				p.starts = append(p.starts, c.row)
				break
			}
		}
	}
	return p.starts[e], nil
}

// Rows returns rows first .. first+n-1 as a batch of n rows.
func (p *Packed) Rows(first int64, n int) (model.Batch, error) {
	if n < 1 {
		panic(fmt.Sprintf("data: Rows(%d, %d)", first, n))
	}
	b := emptyBatch(n, p.seq)
	if err := p.RowsInto(&b, first); err != nil {
		return model.Batch{}, err
	}
	return b, nil
}

// RowsInto fills b, a batch of b.Rows rows of Seq tokens with IDs,
// Targets and Pos of that length, with rows first .. first+b.Rows-1,
// reusing its slices (no allocation).
func (p *Packed) RowsInto(b *model.Batch, first int64) error {
	n := b.Rows * p.seq
	if first < 0 || b.Rows < 1 || b.Seq != p.seq || len(b.IDs) != n || len(b.Targets) != n || len(b.Pos) != n {
		panic(fmt.Sprintf("data: RowsInto row %d of a %d×%d batch (%d ids, %d targets, %d positions) of rows of %d", first, b.Rows, b.Seq, len(b.IDs), len(b.Targets), len(b.Pos), p.seq))
	}
	for i := range b.IDs {
		b.IDs[i], b.Targets[i], b.Pos[i] = 0, model.IgnoreTarget, int32(i%p.seq)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.seek(first); err != nil {
		return err
	}
	for r := range b.Rows {
		if err := p.next(&p.cur, b, r); err != nil {
			return err
		}
	}
	return nil
}

// emptyBatch is n rows of padding: id 0, no targets, positions 0 .. seq-1.
func emptyBatch(n, seq int) model.Batch {
	b := model.Batch{Rows: n, Seq: seq, IDs: make([]int32, n*seq), Targets: make([]int32, n*seq), Pos: make([]int32, n*seq)}
	for i := range b.Targets {
		b.Targets[i] = model.IgnoreTarget
		b.Pos[i] = int32(i % seq)
	}
	return b
}

// seek moves the cursor to row g: forward from where it is, or from the
// start of the latest epoch known to begin at or before g.
func (p *Packed) seek(g int64) error {
	if p.cur.row > g || (p.cur.epoch+1 < len(p.starts) && p.starts[p.cur.epoch+1] <= g) {
		e := len(p.starts) - 1
		for p.starts[e] > g {
			e--
		}
		p.cur = cursor{epoch: e, row: p.starts[e]}
	}
	for p.cur.row < g {
		if err := p.next(&p.cur, nil, 0); err != nil {
			return err
		}
	}
	return nil
}

// next builds the row at c into row r of b (b nil: only moves c past it).
func (p *Packed) next(c *cursor, b *model.Batch, r int) error {
	n, seq := p.tf.Examples(), int64(p.seq)
	col := int64(0)
	for col < seq {
		if c.p == n {
			if col > 0 {
				break // the epoch's last row: padded
			}
			c.epoch, c.p, c.piece = c.epoch+1, 0, 0
			if len(p.starts) == c.epoch {
				p.starts = append(p.starts, c.row)
			}
			continue
		}
		start, end, err := p.tf.Span(p.order(c.epoch, c.p))
		if err != nil {
			return err
		}
		cols := end - start - 1 - c.piece // the columns left of this example
		if cols <= 0 {
			c.p, c.piece = c.p+1, 0
			continue
		}
		take := min(cols, seq)
		if col > 0 && take > seq-col {
			break // next fit: the row is padded, the example starts the next
		}
		if b != nil {
			if err := p.fill(b, r*p.seq+int(col), start+c.piece, int(take)); err != nil {
				return err
			}
		}
		col += take
		if take == cols {
			c.p, c.piece = c.p+1, 0
		} else {
			c.piece += take
		}
	}
	if b != nil {
		for j := range seq - col { // padding: its own positions from 0
			b.Pos[int64(r)*seq+col+j] = int32(j)
		}
	}
	c.row++
	return nil
}

// fill writes the piece of take columns from token tok at b's position
// at: inputs tok .. tok+take-1, their targets where the loss bit is set.
func (p *Packed) fill(b *model.Batch, at int, tok int64, take int) error {
	if cap(p.ids) < take+1 {
		p.ids, p.train = make([]int32, take+1), make([]bool, take+1)
	}
	ids, train := p.ids[:take+1], p.train[:take+1]
	if err := p.tf.read(tok, ids, train, &p.bytes); err != nil {
		return err
	}
	for j := range take {
		b.IDs[at+j] = ids[j]
		b.Pos[at+j] = int32(j)
		if train[j+1] {
			b.Targets[at+j] = ids[j+1]
		}
	}
	return nil
}

// perm is a pseudo-random permutation of [0, n) without a table: a
// balanced Feistel network over the smallest even number of bits that
// holds n, keyed from (seed, epoch), walked until it lands below n (fewer
// than 4 rounds of the network on average). O(1) memory for any n.
type perm struct {
	n     int64
	epoch int
	half  uint
	mask  uint64
	keys  [6]uint64
}

func newPerm(n int64, seed uint64, epoch int) perm {
	p := perm{n: n, epoch: epoch}
	if n > 1 {
		p.half = uint(bits.Len64(uint64(n-1))+1) / 2
	}
	p.mask = 1<<p.half - 1
	s := seed ^ (uint64(epoch)+1)*0x9e3779b97f4a7c15
	for i := range p.keys {
		s += 0x9e3779b97f4a7c15
		p.keys[i] = mix64(s)
	}
	return p
}

// mix64 is splitmix64's finalizer.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// at is the image of i (0 <= i < n).
func (p perm) at(i int64) int64 {
	if p.n <= 1 {
		return i
	}
	x := uint64(i)
	for {
		l, r := x>>p.half, x&p.mask
		for _, k := range p.keys {
			l, r = r, l^(mix64(r^k)&p.mask)
		}
		x = l<<p.half | r
		if x < uint64(p.n) {
			return int64(x)
		}
	}
}
