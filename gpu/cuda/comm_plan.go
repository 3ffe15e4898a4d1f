package cuda

import "github.com/strata-ai/strata/gpu"

// The arithmetic of the rank-order collectives, apart from the driver so
// that it is tested without a GPU (comm_plan_test.go).

// readOrder is the order in which rank r of n reads its peers: r+1, r+2,
// ..., n-1, 0, ..., r. At every step k the n ranks read n different ranks
// (rank r reads r+k mod n), so no GPU's outbound link serves all readers at
// once, as it would if every rank read 0, 1, ..., n-1. The order of the
// reads does not change any result: each lands in its rank's place and the
// reduction adds the places in rank order.
func readOrder(r, n int) []int {
	out := make([]int, n)
	for k := range n {
		out[k] = (r + 1 + k) % n
	}
	return out
}

// span is elements [off, off+n).
type span struct{ off, n int }

// sliceOf is rank r's part of length elements split among n ranks, as the
// two-phase AllReduce splits its buffer: ceil(length/n) elements each in
// rank order, the last parts shorter or empty.
func sliceOf(length, n, r int) span {
	per := (length + n - 1) / n
	lo := min(r*per, length)
	hi := min(lo+per, length)
	return span{lo, hi - lo}
}

// rankOrderScratchBytes is the scratch rank r's part of a collective
// needs on the rank-order path (its dtype is elemBytes wide): AllReduce
// reads its slice of every rank's buffer (n × the slice: about the buffer,
// not n times it), ReduceScatter every rank's segment for it (n × recv, the
// size of send), AllGather its inputs only when staged (some rank's send
// overlaps its recv other than in place: n × send); Broadcast and Barrier
// none.
func rankOrderScratchBytes(c call, r, n int, staged bool) int64 {
	switch c.Kind {
	case gpu.CollAllReduce:
		return int64(n) * int64(sliceOf(c.Send.Len(), n, r).n) * int64(c.Send.DType().Size())
	case gpu.CollReduceScatter:
		return int64(n) * c.Recv.Bytes()
	case gpu.CollAllGather:
		if staged {
			return int64(n) * c.Send.Bytes()
		}
	}
	return 0
}

// extent is a byte range [lo, lo+n) of device addresses.
type extent struct{ lo, n uint64 }

func (e extent) overlaps(f extent) bool {
	return e.n > 0 && f.n > 0 && e.lo < f.lo+f.n && f.lo < e.lo+e.n
}

// inPlaceOrApart reports whether a send and a recv of one rank are apart
// or in place in NCCL's sense: send is exactly the rank's slot of recv
// (AllGather: send == recv + rank·send; ReduceScatter, with the roles
// swapped: recv == send + rank·recv). Other overlaps are refused by NCCL's
// path; the rank-order path then writes outputs after every rank's reads.
func inPlaceOrApart(whole, part extent, rank int) bool {
	return !whole.overlaps(part) || part.lo == whole.lo+uint64(rank)*part.n
}
