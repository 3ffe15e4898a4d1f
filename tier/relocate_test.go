package tier

import (
	"bytes"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// TestFragmentedHostRelocates: the host pool's free bytes hold a move but
// no free run does. The store moves an idle host copy (dirty: its only
// valid data) out of the way instead of refusing the move; a leased copy
// stays where it is, and every copy keeps its bytes.
func TestFragmentedHostRelocates(t *testing.T) {
	checkLeaks(t)
	r := newRig(t, rigConfig{poolBytes: 4 * units.MiB, swapBytes: 16 * units.MiB})
	key := func(c int) shard.Key { return shard.Key{Chunk: shard.ChunkID(c), State: shard.Master} }
	const elems = 1 << 18 // 1 MiB of fp32
	for c := range 4 {
		if err := r.s.Register(key(c), Spec{Elems: elems, DType: dtype.F32, Home: shard.NVMe}); err != nil {
			t.Fatal(err)
		}
	}
	big := shard.Key{Chunk: 9, State: shard.Master}
	if err := r.s.Register(big, Spec{Elems: 2 * elems, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	bigData := pattern(big, 1, 8*elems)
	if err := r.s.WriteHome(big, bigData); err != nil {
		t.Fatal(err)
	}
	// Chunks 0-3 in host, at 0, 1, 2 and 3 MiB of the pool, each written
	// there (dirty: the host copy is the only valid one).
	data := make([][]byte, 4)
	for c := range 4 {
		r.mustWait(r.s.Fetch(key(c), shard.NVMe, shard.Host))
		data[c] = pattern(key(c), 2, 4*elems)
		r.put(t, key(c), shard.Host, data[c])
	}
	// 2 MiB free in two runs of 1 MiB (chunks 0 and 2 written back and
	// dropped); chunk 1 leased. The lowest of the cheapest runs would move
	// chunk 1; chunk 3 moves instead, to 0.
	for _, c := range []int{0, 2} {
		r.mustWait(r.s.Evict(key(c), shard.Host))
	}
	held, err := r.s.Acquire(key(1), shard.Host, shard.Read)
	if err != nil {
		t.Fatal(err)
	}
	heldAt := &held.Bytes()[0]

	r.mustWait(r.s.Fetch(big, shard.NVMe, shard.Host))
	if st := r.pool.Stats(); st.Relocations != 1 || st.RelocatedBytes != units.MiB {
		t.Fatalf("pool stats %+v: want chunk 3 (1 MiB) moved", st)
	}
	if &held.Bytes()[0] != heldAt || !bytes.Equal(held.Bytes(), data[1]) {
		t.Fatal("the leased copy moved or changed")
	}
	held.Release()
	got, err := r.get(t, big, shard.Host)
	if err != nil || !bytes.Equal(got, bigData) {
		t.Fatalf("the fetched shard: %v, or its bytes differ", err)
	}
	r.mustWait(r.s.Evict(big, shard.Host)) // clean: room for chunks 0 and 2
	for c := range 4 {
		if c == 0 || c == 2 {
			r.mustWait(r.s.Fetch(key(c), shard.NVMe, shard.Host))
		}
		got, err := r.get(t, key(c), shard.Host)
		if err != nil || !bytes.Equal(got, data[c]) {
			t.Fatalf("chunk %d: %v, or its bytes changed", c, err)
		}
	}
}
