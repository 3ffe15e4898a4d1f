package tier

import (
	"bytes"
	"errors"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// TestShardIO writes a shard of each home with WriteHome, reads it back with
// ReadNewest from each tier that may hold its newest copy, and checks that
// both leave the residency as Register does: valid in the home only.
func TestShardIO(t *testing.T) {
	checkLeaks(t)
	r := newRig(t, rigConfig{devices: 2, swapBytes: 4 * units.MiB})
	homeOnly := func(k shard.Key, home shard.Tier) {
		t.Helper()
		w, err := r.s.Where(k)
		if err != nil {
			t.Fatal(err)
		}
		for tr := range shard.TierCount {
			if got, want := w.Copies[tr].Valid || w.Copies[tr].Present, shard.Tier(tr) == home; got != want {
				t.Errorf("%s: %s copy present/valid %v, want %v (%+v)", k, shard.Tier(tr), got, want, w.Copies[tr])
			}
		}
	}
	for i, home := range []shard.Tier{shard.HBM, shard.Host, shard.NVMe} {
		k := shard.Key{Chunk: shard.ChunkID(i), Rank: 1, State: shard.Master}
		if err := r.s.Register(k, Spec{Elems: 3001, DType: dtype.F32, Home: home}); err != nil {
			t.Fatal(err)
		}
		want := pattern(k, 7, 4*3001)
		if err := r.s.WriteHome(k, want); err != nil {
			t.Fatalf("%s home: write: %v", home, err)
		}
		homeOnly(k, home)
		got := make([]byte, len(want))
		if err := r.s.ReadNewest(k, got); err != nil {
			t.Fatalf("%s home: read: %v", home, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s home: read back other bytes", home)
		}
		homeOnly(k, home)

		// The newest copy away from home: written in HBM (or in host RAM
		// for an HBM home), the home stale.
		away := shard.HBM
		if home == shard.HBM {
			away = shard.Host
		}
		r.mustWait(r.s.Fetch(k, home, away))
		newer := pattern(k, 8, int64(len(want)))
		r.put(t, k, away, newer)
		clear(got)
		if err := r.s.ReadNewest(k, got); err != nil {
			t.Fatalf("%s home, newest in %s: read: %v", home, away, err)
		}
		if !bytes.Equal(got, newer) {
			t.Errorf("%s home, newest in %s: read the stale copy", home, away)
		}

		if err := r.s.WriteHome(k, want[1:]); !errors.Is(err, ErrBadMove) {
			t.Errorf("%s home: write of the wrong size: %v, want ErrBadMove", home, err)
		}
		if err := r.s.ReadNewest(k, got[1:]); !errors.Is(err, ErrBadMove) {
			t.Errorf("%s home: read of the wrong size: %v, want ErrBadMove", home, err)
		}
	}
	if st := r.s.Stats(); st.Failed != 0 || st.InFlight != 0 {
		t.Errorf("after the shard I/O: %s", st)
	}
}
