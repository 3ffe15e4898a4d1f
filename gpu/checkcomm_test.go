package gpu

import (
	"strings"
	"testing"
)

// fakeBuf is a Buffer of dt×n with no memory.
type fakeBuf struct {
	dt DType
	n  int
}

func (b fakeBuf) DType() DType            { return b.dt }
func (b fakeBuf) Len() int                { return b.n }
func (b fakeBuf) Bytes() int64            { return int64(b.n * b.dt.Size()) }
func (b fakeBuf) DeviceIndex() int        { return 0 }
func (b fakeBuf) Slice(off, n int) Buffer { return fakeBuf{b.dt, n} }

// TestRoundsJoin: the round goes to the rank whose call completes it, with
// every rank's call and data, and Err names the first disagreement.
func TestRoundsJoin(t *testing.T) {
	f32 := fakeBuf{F32, 10}
	ok := Call[fakeBuf]{Kind: CollAllReduce, Send: f32, Recv: f32, Op: Sum}
	cases := []struct {
		name string
		last Call[fakeBuf]
		want string // in Err; "" for agreement
	}{
		{"agree", ok, ""},
		{"kind", Call[fakeBuf]{Kind: CollBarrier}, "rank 2 called barrier, rank 0 all-reduce"},
		{"length", Call[fakeBuf]{Kind: CollAllReduce, Send: fakeBuf{F32, 11}, Op: Sum}, "rank 2 has 11 elements of f32, rank 0 10 of f32"},
		{"dtype", Call[fakeBuf]{Kind: CollAllReduce, Send: fakeBuf{BF16, 10}, Op: Sum}, "rank 2 has 10 elements of bf16"},
		{"op", Call[fakeBuf]{Kind: CollAllReduce, Send: f32, Op: Avg}, "rank 2 reduces with op 1, rank 0 with 0"},
		{"root", Call[fakeBuf]{Kind: CollAllReduce, Send: f32, Op: Sum, Root: 1}, "rank 2 has root 1, rank 0 root 0"},
	}
	for _, c := range cases {
		g := NewRounds[fakeBuf, string]("gpu/test", 3)
		for seq := uint64(1); seq <= 2; seq++ { // rounds are independent
			if g.Join(seq, 1, ok, "b") != nil || g.Join(seq, 0, ok, "a") != nil {
				t.Fatalf("%s: a round was handed out before every rank joined", c.name)
			}
			rd := g.Join(seq, 2, c.last, "c")
			if rd == nil || rd.Seq != seq || strings.Join(rd.Ranks, "") != "abc" || rd.Calls[2] != c.last {
				t.Fatalf("%s: round %d: %+v", c.name, seq, rd)
			}
			switch {
			case c.want == "" && rd.Err != nil:
				t.Errorf("%s: %v", c.name, rd.Err)
			case c.want != "" && (rd.Err == nil || !strings.Contains(rd.Err.Error(), c.want) || !strings.HasPrefix(rd.Err.Error(), "gpu/test: collective")):
				t.Errorf("%s: error %v, want one with %q", c.name, rd.Err, c.want)
			}
		}
		if len(g.open) != 0 {
			t.Errorf("%s: %d rounds left open", c.name, len(g.open))
		}
	}
}

// TestRingBytes: what a ring algorithm sends from each rank.
func TestRingBytes(t *testing.T) {
	b100, b400 := fakeBuf{F32, 100}, fakeBuf{F32, 400}
	for _, c := range []struct {
		call       Call[fakeBuf]
		rank, size int
		want       int64
	}{
		{Call[fakeBuf]{Kind: CollAllGather, Send: b100, Recv: b400}, 0, 4, 3 * 400},
		{Call[fakeBuf]{Kind: CollReduceScatter, Send: b400, Recv: b100}, 3, 4, 3 * 400},
		{Call[fakeBuf]{Kind: CollAllReduce, Send: b400, Recv: b400}, 1, 4, 2 * 3 * 1600 / 4},
		{Call[fakeBuf]{Kind: CollBroadcast, Send: b100, Recv: b100, Root: 2}, 0, 4, 400},
		{Call[fakeBuf]{Kind: CollBroadcast, Send: b100, Recv: b100, Root: 2}, 1, 4, 0}, // the rank before root
		{Call[fakeBuf]{Kind: CollBroadcast, Send: b100, Recv: b100}, 0, 1, 400},
		{Call[fakeBuf]{Kind: CollBarrier}, 0, 4, 0},
	} {
		if got := RingBytes(c.call, c.rank, c.size); got != c.want {
			t.Errorf("%s rank %d of %d: %d bytes, want %d", c.call.Kind, c.rank, c.size, got, c.want)
		}
	}
}
