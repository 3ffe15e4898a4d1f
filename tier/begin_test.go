package tier

import (
	"bytes"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// TestRunnerBeginAwait: accesses declared by one goroutine (Begin) are
// leased by another (Await) with their NVMe contents; a declared access
// that will not be leased is abandoned; nothing stays leased; a Pending
// awaited twice panics.
func TestRunnerBeginAwait(t *testing.T) {
	checkLeaks(t)
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB})
	var keys []shard.Key
	want := map[shard.Key][]byte{}
	for c := range 2 {
		k := shard.Key{Chunk: shard.ChunkID(c), State: shard.Master}
		if err := r.s.Register(k, Spec{Elems: 25000, DType: dtype.F32, Home: shard.NVMe}); err != nil {
			t.Fatal(err)
		}
		want[k] = pattern(k, 7, 100000)
		r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
		r.put(t, k, shard.Host, want[k])
		r.mustWait(r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}))
		keys = append(keys, k)
	}
	_, run := plannerFor(t, r, keys...)
	acc := func(k shard.Key) shard.Access {
		return shard.Access{Key: k, Phase: shard.Optimizer, Tier: shard.Host, Kind: shard.Read}
	}
	var ps []*Pending
	for _, k := range keys {
		p, err := run.Begin(acc(k))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	errs := make(chan error, 1)
	go func() { // cpuadam's goroutine: the rank has gone on
		for i, p := range ps {
			l, err := run.Await(p)
			if err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(l.Bytes(), want[keys[i]]) {
				t.Errorf("%s: the leased copy differs from what was written", keys[i])
			}
			run.Done(l, nil)
		}
		errs <- nil
	}()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	p, err := run.Begin(acc(keys[0]))
	if err != nil {
		t.Fatal(err)
	}
	run.Abandon(p)
	run.Settle()
	for _, k := range keys {
		if w, _ := r.s.Where(k); w.Copies[shard.Host].Leases != 0 {
			t.Errorf("%s: %d leases left", k, w.Copies[shard.Host].Leases)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("a Pending awaited after it was abandoned did not panic")
		}
	}()
	run.Await(p)
}
