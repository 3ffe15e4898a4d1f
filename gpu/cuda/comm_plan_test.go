package cuda

import (
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// These tests need no GPU: the arithmetic of the rank-order collectives.

func TestReadOrderRotates(t *testing.T) {
	for n := 1; n <= 9; n++ {
		orders := make([][]int, n)
		for r := range n {
			orders[r] = readOrder(r, n)
			sorted := slices.Sorted(slices.Values(orders[r]))
			if !slices.Equal(sorted, readOrder(n-1, n)) || len(sorted) != n {
				t.Fatalf("n=%d rank %d reads %v: not every rank once", n, r, orders[r])
			}
			if orders[r][0] != (r+1)%n || orders[r][n-1] != r {
				t.Errorf("n=%d rank %d reads %v: want r+1 first and itself last", n, r, orders[r])
			}
		}
		// At every step the ranks read n different ranks: no GPU serves
		// two readers at once.
		for k := range n {
			seen := map[int]int{}
			for r := range n {
				if q, dup := seen[orders[r][k]]; dup {
					t.Errorf("n=%d step %d: ranks %d and %d both read rank %d", n, k, q, r, orders[r][k])
				}
				seen[orders[r][k]] = r
			}
		}
	}
}

func TestSliceOfCovers(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for length := 0; length <= 70; length++ {
			next := 0
			for r := range n {
				s := sliceOf(length, n, r)
				if s.off != next || s.n < 0 || s.n > (length+n-1)/n {
					t.Fatalf("length %d, n %d: rank %d's slice %+v after %d", length, n, r, s, next)
				}
				next = s.off + s.n
			}
			if next != length {
				t.Fatalf("length %d, n %d: slices end at %d", length, n, next)
			}
		}
	}
}

func TestRankOrderScratch(t *testing.T) {
	buf := func(dt gpu.DType, n int) *Buffer { return &Buffer{Extent: gpu.Scratch(dt, n)} }
	const n, m = 4, 37
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F64} {
		es := int64(dt.Size())
		big := buf(dt, n*m)
		// AllReduce: n slices of ceil(len/n): about the buffer, where the
		// one-phase AllReduce took n times it.
		for r := range n {
			got := rankOrderScratchBytes(call{Kind: gpu.CollAllReduce, Send: big, Recv: big}, r, n, false)
			if want := int64(n) * int64(sliceOf(n*m, n, r).n) * es; got != want || got > big.Bytes()+int64(n)*es {
				t.Errorf("%s all-reduce rank %d: scratch %d bytes, want %d (buffer %d)", dt, r, got, want, big.Bytes())
			}
		}
		small := buf(dt, m)
		if got := rankOrderScratchBytes(call{Kind: gpu.CollReduceScatter, Send: big, Recv: small}, 1, n, false); got != big.Bytes() {
			t.Errorf("%s reduce-scatter: scratch %d bytes, want the send's %d", dt, got, big.Bytes())
		}
		ag := call{Kind: gpu.CollAllGather, Send: small, Recv: big}
		if got := rankOrderScratchBytes(ag, 1, n, false); got != 0 {
			t.Errorf("%s all-gather apart or in place: scratch %d bytes, want none", dt, got)
		}
		if got := rankOrderScratchBytes(ag, 1, n, true); got != big.Bytes() {
			t.Errorf("%s all-gather staged: scratch %d bytes, want %d", dt, got, big.Bytes())
		}
		if got := rankOrderScratchBytes(call{Kind: gpu.CollBroadcast, Send: big, Recv: big}, 1, n, false); got != 0 {
			t.Errorf("%s broadcast: scratch %d bytes, want none", dt, got)
		}
	}
	if got := rankOrderScratchBytes(call{Kind: gpu.CollBarrier}, 0, n, false); got != 0 {
		t.Errorf("barrier: scratch %d bytes", got)
	}
}

func TestInPlaceOrApart(t *testing.T) {
	recv := extent{1 << 20, 4 * 256}
	for _, c := range []struct {
		name string
		part extent
		rank int
		want bool
	}{
		{"apart, before", extent{0, 256}, 2, true},
		{"apart, just after", extent{recv.lo + recv.n, 256}, 2, true},
		{"in place (rank 2's slot)", extent{recv.lo + 512, 256}, 2, true},
		{"rank 0 in place", extent{recv.lo, 256}, 0, true},
		{"another rank's slot", extent{recv.lo + 256, 256}, 2, false},
		{"straddling two slots", extent{recv.lo + 600, 256}, 2, false},
		{"empty", extent{recv.lo + 100, 0}, 2, true},
	} {
		if got := inPlaceOrApart(recv, c.part, c.rank); got != c.want {
			t.Errorf("%s: inPlaceOrApart = %t, want %t", c.name, got, c.want)
		}
	}
}

func TestDescribePeers(t *testing.T) {
	if got := describePeers(1, nil); got != "" {
		t.Errorf("one GPU: %q", got)
	}
	if got := describePeers(8, nil); got != "peer access between all 8 GPUs" {
		t.Errorf("8 GPUs, all pairs: %q", got)
	}
	got := describePeers(4, []peerMiss{{gpuPair: gpuPair{0, 3}}, {gpuPair: gpuPair{3, 0}, why: "cuda: cuCtxEnablePeerAccess: CUDA_ERROR_TOO_MANY_PEERS"}})
	for _, want := range []string{"GPU 0 to 3", "GPU 3 to 0 (cuda: cuCtxEnablePeerAccess: CUDA_ERROR_TOO_MANY_PEERS)", "staged through host memory"} {
		if !strings.Contains(got, want) {
			t.Errorf("describePeers = %q, want it to say %q", got, want)
		}
	}
}
