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
// keep the pairs in a tree so that a piece of n symbols costs
// O(n log n), not O(n²).
func (t *Tokenizer) bpe(piece string, s *scratch, out []int32) []int32 {
	ids := t.alphabet.symbols(piece, s.ids[:0])
	if len(ids) > treeFromSymbols {
		out = t.bpeTree(ids, s, out)
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
		m, _ := t.merges.get(pairKey(ids[best], ids[best+1]))
		ids[best] = m.id
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
// the order by (rank, position) interleaves the two sides' merges
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

// treeFromSymbols is the piece length from which bpe keeps its pairs in
// a tree (measured on bytes: the scan is faster below it).
const treeFromSymbols = 48

func (t *Tokenizer) rank(a, b int32) int32 {
	if m, ok := t.merges.get(pairKey(a, b)); ok {
		return m.rank
	}
	return noMerge
}

// symbol is one token of a piece being merged, in a doubly linked list
// over the piece's first symbols, with the merge of it and its right
// neighbour when there is one.
type symbol struct {
	id         int32
	prev, next int32 // positions, -1 at the ends
	into       int32 // what the pair at this position merges into
}

// noPair is the tree's key of a position with no merge: a symbol merged
// into its left neighbour, the last one, or a pair without a rule.
const noPair = ^uint64(0)

// bpeTree is bpe with the pairs in a tournament tree: leaf p holds
// rank<<32 | p for the pair of the symbol at position p and its right
// neighbour (noPair if none), each inner node the least of its two
// children, so the root is the merge to apply next, at its leftmost
// place, as the scan finds it. A merge changes three leaves (the pair,
// the one before it, the right symbol's, which goes) and the nodes above
// them while they change. It holds one entry per live pair, so nothing
// goes stale, as in a heap of candidates.
func (t *Tokenizer) bpeTree(ids []int32, s *scratch, out []int32) []int32 {
	n := len(ids)
	syms := s.syms[:0]
	for i, id := range ids {
		syms = append(syms, symbol{id: id, prev: int32(i - 1), next: int32(i + 1)})
	}
	syms[n-1].next = -1
	leaves := 1
	for leaves < n {
		leaves *= 2
	}
	tree := s.tree[:0]
	tree = append(tree, make([]uint64, 2*leaves)...)
	for p := range leaves {
		tree[leaves+p] = noPair
		if p+1 < n {
			if m, ok := t.merges.get(pairKey(ids[p], ids[p+1])); ok {
				tree[leaves+p] = uint64(m.rank)<<32 | uint64(p)
				syms[p].into = m.id
			}
		}
	}
	for i := leaves - 1; i > 0; i-- {
		tree[i] = min(tree[2*i], tree[2*i+1])
	}
	// set makes leaf p key and updates the nodes above it.
	set := func(p int32, key uint64) {
		i := leaves + int(p)
		tree[i] = key
		for i > 1 {
			parent := i >> 1
			least := min(tree[i], tree[i^1])
			if tree[parent] == least {
				break
			}
			tree[parent] = least
			i = parent
		}
	}
	// pair sets the leaf of the pair at position p from its ids.
	pair := func(p int32) {
		key := noPair
		if next := syms[p].next; next >= 0 {
			if m, ok := t.merges.get(pairKey(syms[p].id, syms[next].id)); ok {
				key = uint64(m.rank)<<32 | uint64(p)
				syms[p].into = m.id
			}
		}
		set(p, key)
	}
	for tree[1] != noPair {
		pos := int32(uint32(tree[1]))
		sym := &syms[pos]
		right := sym.next
		sym.id = sym.into
		sym.next = syms[right].next
		if sym.next >= 0 {
			syms[sym.next].prev = pos
		}
		set(right, noPair)
		if sym.prev >= 0 {
			pair(sym.prev)
		}
		pair(pos)
	}
	for p := int32(0); p >= 0; p = syms[p].next {
		out = append(out, syms[p].id)
	}
	s.syms, s.tree = syms, tree
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
