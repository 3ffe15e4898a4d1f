package prefetch

import (
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestAheadJudgedWhenAwaited: an access declared ahead of its use
// (shard.Access.Ahead) is neither counted nor judged when declared, when its shard is
// still on NVMe, but when it is awaited: a hit once the read has landed,
// late while it is under way. An access declared at its use is judged at
// once, as before.
func TestAheadJudgedWhenAwaited(t *testing.T) {
	key := func(c int) shard.Key { return shard.Key{Chunk: shard.ChunkID(c), State: shard.Master} }
	res := Residency{}
	for c := range 2 {
		res[key(c)] = Placement{SizeBytes: 4096, Home: shard.NVMe}
	}
	p, err := New(res, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	p.BeginStep(0)
	acc := func(c int, ahead bool) shard.Access {
		return shard.Access{Key: key(c), Phase: shard.Optimizer, Tier: shard.Host, Kind: shard.Update, Ahead: ahead}
	}
	// Chunk 0, ahead: its demand read is issued, nothing is counted yet.
	hit, moves, err := p.Access(acc(0, true), 1*ms)
	if err != nil || hit || len(moves) == 0 {
		t.Fatalf("ahead access: hit %v, moves %v, err %v; want a read issued", hit, moves, err)
	}
	if st := p.Stats(); st.Accesses != 0 || st.Hits+st.Late+st.Misses+st.Dependent != 0 {
		t.Fatalf("declared ahead: %+v; want nothing counted yet", st)
	}
	for _, m := range moves {
		p.Completed(m, 2*ms)
	}
	p.Awaited(acc(0, true), 3*ms)
	if st := p.Stats(); st.Accesses != 1 || st.Hits != 1 {
		t.Fatalf("awaited after its read landed: %+v; want one access, a hit", st)
	}
	p.Release(key(0), 4*ms)
	// Chunk 1, ahead, awaited while its read is under way: late.
	if _, moves, err = p.Access(acc(1, true), 5*ms); err != nil || len(moves) == 0 {
		t.Fatalf("ahead access of chunk 1: moves %v, err %v", moves, err)
	}
	p.Awaited(acc(1, true), 6*ms)
	if st := p.Stats(); st.Late != 1 || st.Hits != 1 || st.Misses != 0 {
		t.Fatalf("awaited while its read is in flight: %+v; want one late, one hit", st)
	}
	for _, m := range moves {
		p.Completed(m, 7*ms)
	}
	p.Release(key(1), 8*ms)
	// At its use (not ahead), on NVMe with nothing in flight: a miss at once.
	p.Access(acc(0, false), 9*ms)
	if st := p.Stats(); st.Accesses != 3 || st.Hits+st.Late+st.Misses+st.Dependent != 3 {
		t.Fatalf("an access at its use: %+v; want it judged when declared", st)
	}
}

// TestRoomWaits: a write that finds no room in its tier (the one shard
// the host holds is in use) is a miss and a room wait; a read with
// nothing under way for it is a miss only.
func TestRoomWaits(t *testing.T) {
	key := func(c int) shard.Key { return shard.Key{Chunk: shard.ChunkID(c), State: shard.Grad} }
	res := Residency{}
	for c := range 2 {
		res[key(c)] = Placement{SizeBytes: 4096, Home: shard.NVMe}
	}
	o := DefaultOptions()
	o.BudgetBytes[shard.Host] = 4096 // one shard
	p, err := New(res, o)
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	p.BeginStep(0)
	acc := func(c int, k shard.Kind) shard.Access {
		return shard.Access{Key: key(c), Phase: shard.Backward, Tier: shard.Host, Kind: k}
	}
	if _, moves, err := p.Access(acc(0, shard.Read), 1*ms); err != nil || len(moves) == 0 {
		t.Fatalf("read of chunk 0: moves %v, err %v; want its demand read", moves, err)
	}
	if st := p.Stats(); st.Misses != 1 || st.RoomWaits != 0 {
		t.Fatalf("a read with nothing under way: %+v; want a miss, no room wait", st)
	}
	// Chunk 0 still in use: chunk 1's write has no room.
	if ok, _, err := p.Access(acc(1, shard.Write), 2*ms); err != nil || ok {
		t.Fatalf("write of chunk 1 with the host full: ready %v, err %v; want it to wait", ok, err)
	}
	if st := p.Stats(); st.Accesses != 2 || st.Misses != 2 || st.RoomWaits != 1 {
		t.Fatalf("a write that found no room: %+v; want two misses, one of them a room wait", st)
	}
}
