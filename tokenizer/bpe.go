package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
	"unicode/utf8"
)

// merge is one rule of the merge table: the pair it applies to becomes
// token id, and lower ranks apply first.
type merge struct{ rank, id int32 }

// pairKey is the merge table's key for the adjacent tokens (a, b).
func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// noMerge is the rank of a pair the table does not hold.
const noMerge = int32(1<<31 - 1)

// bpe turns a piece into token ids by merges: it starts from the
// alphabet's symbols (one token per byte, or per character) and, while
// some adjacent pair has a merge rule, applies the rule of lowest rank at
// its leftmost occurrence (Hugging Face tokenizers' Word::merge_all;
// GPT-2's bpe()). Short pieces scan a rank per adjacent pair; long ones
// use a heap so that a piece of n symbols costs O(n log n), not O(n²).
func (t *Tokenizer) bpe(piece string, s *scratch, out []int32) []int32 {
	ids := t.alphabet.symbols(piece, s.ids[:0])
	if len(ids) > heapFromSymbols {
		out = t.bpeHeap(ids, s, out)
	} else {
		out = t.bpeScan(ids, s, out)
	}
	s.ids = ids[:0]
	return out
}

// bpeScan is bpe with a rank kept per adjacent pair, the lowest found by a
// scan after each merge. It merges ids in place.
func (t *Tokenizer) bpeScan(ids []int32, s *scratch, out []int32) []int32 {
	// ranks[k] is the rank of the pair (ids[k], ids[k+1]).
	ranks := s.ranks[:0]
	for k := 0; k+1 < len(ids); k++ {
		ranks = append(ranks, t.rank(ids[k], ids[k+1]))
	}
	for len(ids) > 1 {
		best := 0
		for k := 1; k < len(ranks); k++ {
			if ranks[k] < ranks[best] {
				best = k
			}
		}
		if ranks[best] == noMerge {
			break
		}
		ids[best] = t.merges[pairKey(ids[best], ids[best+1])].id
		ids = append(ids[:best+1], ids[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		if best > 0 {
			ranks[best-1] = t.rank(ids[best-1], ids[best])
		}
		if best < len(ranks) {
			ranks[best] = t.rank(ids[best], ids[best+1])
		}
	}
	s.ranks = ranks
	return append(out, ids...)
}

// wordCut cuts a piece over characters before a word mark ("▁") where no
// merge can cross, so that a long piece (Llama 2 and Gemma 3 pre-tokenize
// nothing: the text between added tokens is one piece) is merged word by
// word, and each word is cached. The ids cannot change: a merge that
// crossed the cut would make a token whose spelling holds the character
// before the cut and then "▁" (a token's spelling is its two parts'
// together), so when no token has that pair inside it the pair across the
// cut never has a rule, each side picks its merges as if alone, and
// the heap's order by (rank, position) interleaves the two sides' merges
// without changing either. The character before the cut must be a token
// of its own (not byte fallback or unk_token), and so must "▁".
type wordCut struct {
	alphabet *charAlphabet
	mark     string        // "▁"
	keep     map[rune]bool // characters some token has just before an inner "▁"
}

// newWordCut returns the cut for a vocabulary over characters, or nil
// when there is none: "▁" is not a token, or ignore_merges is set (a
// word can be a whole token where the piece is not).
func newWordCut(a *charAlphabet, ignoreMerges bool) *wordCut {
	const mark = "▁"
	if _, ok := a.vocab[mark]; !ok || ignoreMerges {
		return nil
	}
	c := &wordCut{alphabet: a, mark: mark, keep: map[rune]bool{}}
	for tok := range a.vocab {
		for k := 1; k < len(tok); k++ {
			if strings.HasPrefix(tok[k:], mark) {
				r, _ := utf8.DecodeLastRuneInString(tok[:k])
				c.keep[r] = true
			}
		}
	}
	return c
}

// next returns the first word of piece and the rest.
func (c *wordCut) next(piece string) (word, rest string) {
	for from := 1; from < len(piece); {
		k := strings.Index(piece[from:], c.mark)
		if k < 0 {
			break
		}
		at := from + k
		if r, w := utf8.DecodeLastRuneInString(piece[:at]); !c.keep[r] && c.alphabet.hasToken(piece[at-w:at]) {
			return piece[:at], piece[at:]
		}
		from = at + len(c.mark)
	}
	return piece, ""
}

// heapFromSymbols is the piece length from which bpe keeps its candidate
// merges in a heap (measured on bytes: the scan is faster below it).
const heapFromSymbols = 48

func (t *Tokenizer) rank(a, b int32) int32 {
	if m, ok := t.merges[pairKey(a, b)]; ok {
		return m.rank
	}
	return noMerge
}

// symbol is one token of a word being merged, in a doubly linked list over
// the word's first symbols; size 0 marks a symbol merged into its left
// neighbour.
type symbol struct {
	id         int32
	prev, next int32 // positions, -1 at the ends
	size       int32
}

// candidate is a merge of the symbols at a position and its right
// neighbour into id, valid while those two still have the ids it was made
// from. key orders the heap: the rank, then the position.
type candidate struct {
	key         uint64 // rank<<32 | position
	left, right int32  // the ids of the pair
	id          int32  // what they merge into
}

func (c candidate) pos() int32 { return int32(uint32(c.key)) }

// candidates is a binary min-heap of candidate merges by key.
type candidates []candidate

func (h *candidates) push(c candidate) {
	*h = append(*h, c)
	a := *h
	i := len(a) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if a[parent].key <= c.key {
			break
		}
		a[i] = a[parent]
		i = parent
	}
	a[i] = c
}

// pop removes the least candidate. The hole at the root goes down to a
// leaf by the lesser child, and the last element then rises from there
// (it usually belongs near the bottom): about half the comparisons of
// sifting it down from the root.
func (h *candidates) pop() candidate {
	a := *h
	top := a[0]
	n := len(a) - 1
	last := a[n]
	a = a[:n]
	if n == 0 {
		*h = a
		return top
	}
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		if r := l + 1; r < n && a[r].key < a[l].key {
			l = r
		}
		a[i] = a[l]
		i = l
	}
	for i > 0 {
		parent := (i - 1) / 2
		if a[parent].key <= last.key {
			break
		}
		a[i] = a[parent]
		i = parent
	}
	a[i] = last
	*h = a
	return top
}

// bpeHeap is bpe with the candidate merges in a heap ordered by (rank,
// position): the same merges in the same order.
func (t *Tokenizer) bpeHeap(ids []int32, s *scratch, out []int32) []int32 {
	n := len(ids)
	syms := s.syms[:0]
	for i, id := range ids {
		syms = append(syms, symbol{id: id, prev: int32(i - 1), next: int32(i + 1), size: 1})
	}
	syms[n-1].next = -1
	h := s.heap[:0]
	push := func(pos int32) {
		right := syms[pos].next
		if right < 0 {
			return
		}
		a, b := syms[pos].id, syms[right].id
		if m, ok := t.merges[pairKey(a, b)]; ok {
			h.push(candidate{key: uint64(m.rank)<<32 | uint64(uint32(pos)), left: a, right: b, id: m.id})
		}
	}
	for i := 0; i < n-1; i++ {
		push(int32(i))
	}
	for len(h) > 0 {
		c := h.pop()
		pos := c.pos()
		sym := &syms[pos]
		if sym.size == 0 || sym.next < 0 || sym.id != c.left || syms[sym.next].id != c.right {
			continue // stale: one side has been merged since
		}
		right := sym.next
		sym.id = c.id
		sym.size += syms[right].size
		sym.next = syms[right].next
		syms[right].size = 0
		if sym.next >= 0 {
			syms[sym.next].prev = pos
		}
		if sym.prev >= 0 {
			push(sym.prev)
		}
		push(pos)
	}
	for p := int32(0); p >= 0; p = syms[p].next {
		out = append(out, syms[p].id)
	}
	s.syms, s.heap = syms, h
	return out
}

// cache remembers the ids of pieces already merged, so the merges of a
// frequent word are paid once. It is bounded: cacheShards shards of at
// most cacheShardEntries pieces, each of at most cacheMaxPieceBytes bytes;
// a full shard is emptied and refilled. Safe for concurrent use.
type cache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

const (
	cacheShards        = 64
	cacheShardEntries  = 2048 // 131072 pieces in all: a few MB
	cacheMaxPieceBytes = 256
)

type cacheShard struct {
	mu sync.Mutex
	m  map[string][]int32
}

func newCache() *cache {
	c := &cache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int32)
	}
	return c
}

func (c *cache) shard(piece string) *cacheShard {
	return &c.shards[maphash.String(c.seed, piece)%cacheShards]
}

func (c *cache) get(piece string) ([]int32, bool) {
	sh := c.shard(piece)
	sh.mu.Lock()
	ids, ok := sh.m[piece]
	sh.mu.Unlock()
	return ids, ok
}

func (c *cache) put(piece string, ids []int32) {
	sh := c.shard(piece)
	sh.mu.Lock()
	if len(sh.m) >= cacheShardEntries {
		clear(sh.m)
	}
	sh.m[piece] = ids
	sh.mu.Unlock()
}

// reset empties the cache (benchmarks of the cold path).
func (c *cache) reset() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}
