package tokenizer

import "math/bits"

// mergeTable is the merge rules by pair: a flat open-addressing table
// keyed by pairKey, probed linearly from a multiplicative hash. A lookup
// is one multiply and, at the load of at most a half it is built with,
// usually one slot, where Go's map costs two to three times as much; the
// merge loop of a long piece is mostly lookups. Its size is 16 bytes a
// slot, 2 to 4 slots a merge: 8 MB for Llama-3's 280,147 merges, 16 MB
// for Gemma 3's 514,906. Filled at Load, then only read.
type mergeTable struct {
	slots []mergeSlot // a power of two of them
	shift uint        // 64 - log2(len(slots))
	count int
}

type mergeSlot struct {
	key      uint64 // pairKey, emptyPair when free
	rank, id int32
}

// emptyPair is the key of a free slot: the pair (-1, -1), which no
// tokens make.
const emptyPair = ^uint64(0)

// newMergeTable returns an empty table sized for n merges.
func newMergeTable(n int) *mergeTable {
	size := 8
	for size < 2*n {
		size *= 2
	}
	t := &mergeTable{slots: make([]mergeSlot, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
	for i := range t.slots {
		t.slots[i].key = emptyPair
	}
	return t
}

// home is the slot a key's probe starts from (Fibonacci hashing).
func (t *mergeTable) home(key uint64) uint64 { return key * 0x9E3779B97F4A7C15 >> t.shift }

// get returns the rule for key.
func (t *mergeTable) get(key uint64) (merge, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i&mask]
		if s.key == key {
			return merge{rank: s.rank, id: s.id}, true
		}
		if s.key == emptyPair {
			return merge{}, false
		}
	}
}

// put sets the rule for key, replacing one already there. It panics past
// the size newMergeTable was given (a broken contract of Load's).
func (t *mergeTable) put(key uint64, m merge) {
	if key == emptyPair {
		panic("tokenizer: merge table: the pair (-1, -1)")
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i&mask]
		if s.key == key {
			s.rank, s.id = m.rank, m.id
			return
		}
		if s.key == emptyPair {
			if 2*(t.count+1) > len(t.slots) {
				panic("tokenizer: merge table: more merges than it was sized for")
			}
			*s = mergeSlot{key: key, rank: m.rank, id: m.id}
			t.count++
			return
		}
	}
}
