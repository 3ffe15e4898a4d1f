package tier

import (
	"fmt"
	"sync"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/shard"
)

// BenchmarkNVMeRoundTrip measures a write-back host->NVMe and a fetch
// NVMe->host of `shards` shards at once through the store, and the same
// transfers as raw nvme.Swap writes and reads of the same extents from the
// same kind of pinned buffers (the anchor). Compare the two ns/op side by
// side: their ratio is the store's overhead (bookkeeping, goroutines,
// leases). The -plain variants run without registering the arenas and swap
// files with io_uring (as the store did before it registered them); the
// hugepage-% metric is how much of the pool the kernel backs with huge
// pages. Run:
//
//	go test -run '^$' -bench NVMeRoundTrip -benchtime 40x -count 3 ./tier
func BenchmarkNVMeRoundTrip(b *testing.B) {
	const shards = 4
	for _, size := range []int64{256 * units.KiB, 1 * units.MiB} {
		name := units.FormatSize(size)
		for _, fixed := range []bool{true, false} {
			v := ""
			if !fixed {
				v = "-plain"
			}
			b.Run(fmt.Sprintf("swap%s/%s", v, name), func(b *testing.B) { benchSwap(b, shards, size, fixed) })
			b.Run(fmt.Sprintf("store%s/%s", v, name), func(b *testing.B) { benchStore(b, shards, size, fixed) })
		}
	}
}

func benchRig(b *testing.B, shards int, size int64, fixed bool) *rig {
	return newRig(b, rigConfig{poolBytes: int64(shards)*size + units.MiB, swapBytes: int64(2*shards)*size + 4*units.MiB, stripeBytes: 128 * units.KiB, noFixedIO: !fixed})
}

// reportHugePages adds the share of the pool on huge pages (after the
// timed loop: ResetTimer drops metrics reported before it).
func reportHugePages(b *testing.B, r *rig) {
	if res := r.pool.Residency(); res.MappedBytes > 0 {
		b.ReportMetric(100*float64(max(res.HugePageBytes, 0))/float64(res.MappedBytes), "hugepage-%")
	}
}

func benchSwap(b *testing.B, shards int, size int64, fixed bool) {
	r := benchRig(b, shards, size, fixed)
	var exts []*nvme.Extent
	var bufs [][]byte
	for i := range shards {
		x, err := r.swap.Alloc(size)
		if err != nil {
			b.Fatal(err)
		}
		buf, err := r.pool.Get(size, "bench")
		if err != nil {
			b.Fatal(err)
		}
		copy(buf.Bytes(), pattern(shard.Key{Chunk: shard.ChunkID(i)}, 1, size))
		exts = append(exts, x)
		b.Cleanup(func() { r.swap.Free(x); r.pool.Put(buf) })
		bufs = append(bufs, buf.Bytes())
	}
	each := func(f func(i int) error) {
		var wg sync.WaitGroup
		for i := range shards {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(i); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	b.SetBytes(2 * size * int64(shards))
	b.ResetTimer()
	for range b.N {
		each(func(i int) error { return r.swap.Write(exts[i], bufs[i]) })
		each(func(i int) error { return r.swap.Read(exts[i], bufs[i]) })
	}
	reportHugePages(b, r)
}

func benchStore(b *testing.B, shards int, size int64, fixed bool) {
	r := benchRig(b, shards, size, fixed)
	var keys []shard.Key
	for i := range shards {
		k := shard.Key{Chunk: shard.ChunkID(i), State: shard.Master}
		if err := r.s.Register(k, Spec{Elems: int(size / 4), DType: dtype.F32, Home: shard.NVMe}); err != nil {
			b.Fatal(err)
		}
		r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
		r.put(b, k, shard.Host, pattern(k, 1, size))
		keys = append(keys, k)
	}
	all := func(m func(k shard.Key) shard.Move) {
		ops := make([]*Op, 0, shards)
		for _, k := range keys {
			ops = append(ops, r.mustOp(r.s.Submit(m(k))))
		}
		for _, op := range ops {
			if err := op.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.SetBytes(2 * size * int64(shards))
	b.ResetTimer()
	for range b.N {
		all(func(k shard.Key) shard.Move {
			return shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}
		})
		all(func(k shard.Key) shard.Move {
			return shard.Move{Key: k, From: shard.NVMe, To: shard.Host, Reason: shard.Prefetch}
		})
		b.StopTimer()
		for _, k := range keys { // dirty again, so the next write-back writes
			l, err := r.s.Acquire(k, shard.Host, shard.Write)
			if err != nil {
				b.Fatal(err)
			}
			l.Release()
		}
		b.StartTimer()
	}
	reportHugePages(b, r)
}
