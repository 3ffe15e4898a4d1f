package tokenizer

// addedSet finds added tokens in text: leftmost-longest, as Hugging Face's
// AddedVocabulary does (Aho-Corasick, MatchKind::LeftmostLongest). It is a
// byte trie; first says which bytes start some token, so text without
// them is skipped at one table lookup a byte.
type addedSet struct {
	first [256]bool
	nodes []trieNode
}

type trieNode struct {
	next map[byte]int32 // child node index
	id   int32          // token ending here, or -1
}

func newAddedSet() *addedSet {
	return &addedSet{nodes: []trieNode{{id: -1}}}
}

func (a *addedSet) add(content string, id int32) {
	a.first[content[0]] = true
	n := int32(0)
	for i := 0; i < len(content); i++ {
		c := content[i]
		child, ok := a.nodes[n].next[c]
		if !ok {
			if a.nodes[n].next == nil {
				a.nodes[n].next = map[byte]int32{}
			}
			child = int32(len(a.nodes))
			a.nodes[n].next[c] = child
			a.nodes = append(a.nodes, trieNode{id: -1})
		}
		n = child
	}
	a.nodes[n].id = id
}

func (a *addedSet) empty() bool { return len(a.nodes) == 1 }

// find returns the leftmost-longest added token in s at or after from:
// its start, end and id, or start -1.
func (a *addedSet) find(s string, from int) (start, end int, id int32) {
	for i := from; i < len(s); i++ {
		if !a.first[s[i]] {
			continue
		}
		n, best, bestID := int32(0), -1, int32(-1)
		for j := i; j < len(s); j++ {
			child, ok := a.nodes[n].next[s[j]]
			if !ok {
				break
			}
			n = child
			if a.nodes[n].id >= 0 {
				best, bestID = j+1, a.nodes[n].id
			}
		}
		if best >= 0 {
			return i, best, bestID
		}
	}
	return -1, -1, -1
}
