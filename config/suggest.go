package config

import "strings"

// editDistance is the Levenshtein distance between a and b, case-insensitive
// (each insertion, deletion or substitution of one character costs 1).
func editDistance(a, b string) int {
	ra, rb := []rune(strings.ToLower(a)), []rune(strings.ToLower(b))
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// Nearest returns the candidate closest to key, or "" when none is close
// enough to be a likely typo: a candidate that starts with the key (a
// truncated name, 4 letters or more) first, else the fewest edits, at most 2
// for short keys and a third of the key's length for long ones. Ties go to
// the earlier candidate.
func Nearest(key string, candidates []string) string {
	best, bestD := "", 1<<30
	if len(key) >= 4 {
		lk := strings.ToLower(key)
		for _, c := range candidates {
			if strings.HasPrefix(strings.ToLower(c), lk) && (best == "" || len(c) < len(best)) {
				best = c
			}
		}
		if best != "" {
			return best
		}
	}
	for _, c := range candidates {
		if d := editDistance(key, c); d < bestD {
			best, bestD = c, d
		}
	}
	limit := max(2, len(key)/3)
	if bestD > limit {
		return ""
	}
	return best
}
