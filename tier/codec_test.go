package tier

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/strata-ai/strata/dtype"
	bfloat "github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/nf4"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// TestCodedShard: a shard stored in NF4 (homed on NVMe, and in host RAM)
// is written and read in its stored bytes, reaches HBM decoded to bf16 as
// nf4.Dequantize gives it (rounded once), the host-to-device link carries
// the stored bytes (a quarter of bf16's, plus the scales), with the
// slots reserved (ReserveHBM takes the codec scratch) and without;
// ReadNewest gives the stored bytes back while the decoded HBM copy is
// valid; a spec of another coding is refused.
func TestCodedShard(t *testing.T) {
	checkLeaks(t)
	for _, c := range []struct {
		home    shard.Tier
		reserve bool
	}{{shard.NVMe, true}, {shard.Host, false}} {
		t.Run(c.home.String(), func(t *testing.T) {
			r := newRig(t, rigConfig{poolBytes: 8 * units.MiB, swapBytes: 16 * units.MiB})
			const n = 64*1000 + 32 // a short last block
			k := shard.Key{Chunk: 3, State: shard.Param}
			spec := Spec{Elems: n, DType: dtype.BF16, Stored: dtype.NF4, Home: c.home}
			if err := r.s.Register(k, spec); err != nil {
				t.Fatal(err)
			}
			vals := make([]float32, n)
			for i := range vals {
				vals[i] = float32(math.Sin(float64(i)*0.01)) * float32(1+i%5)
			}
			q := make([]byte, nf4.Bytes(n))
			nf4.Quantize(q, vals)
			if err := r.s.WriteHome(k, q); err != nil {
				t.Fatal(err)
			}
			if c.reserve {
				if err := r.s.ReserveHBM(shard.Param); err != nil {
					t.Fatal(err)
				}
				if got, want := r.s.SlotBytes()[0], int64(2*n)+nf4.Bytes(n); got < want {
					t.Errorf("slots and codec scratch %d bytes, want at least %d", got, want)
				}
			}
			before := r.s.Stats().Links[shard.HostToHBM].Bytes
			r.mustWait(r.s.Fetch(k, c.home, shard.HBM))
			moved := r.s.Stats().Links[shard.HostToHBM].Bytes - before
			if moved != nf4.Bytes(n) {
				t.Errorf("host->hbm moved %d bytes, want the stored %d", moved, nf4.Bytes(n))
			}
			got, err := r.get(t, k, shard.HBM)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, n)
			nf4.Dequantize(want, q)
			for i := range want {
				if g := binary.LittleEndian.Uint16(got[2*i:]); g != bfloat.FromFloat32(want[i]) {
					t.Fatalf("element %d: %#x in HBM, want bf16 of %v", i, g, want[i])
				}
			}
			back := make([]byte, nf4.Bytes(n))
			if err := r.s.ReadNewest(k, back); err != nil || string(back) != string(q) {
				t.Errorf("ReadNewest: %v, the stored bytes back: %v", err, string(back) == string(q))
			}
			bad := Spec{Elems: n, DType: dtype.F32, Stored: dtype.NF4, Home: shard.Host}
			if err := r.s.Register(shard.Key{Chunk: 4, State: shard.Param}, bad); !errors.Is(err, ErrBadMove) {
				t.Errorf("f32 from nf4: %v", err)
			}
		})
	}
}
