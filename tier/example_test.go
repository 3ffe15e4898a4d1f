package tier_test

import (
	"fmt"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// Example keeps one shard's fp32 params in pinned host memory, uploads them
// to a device's HBM and reads the device copy through a lease.
// The store has no swap, so it has no NVMe tier and needs no O_DIRECT.
func Example() {
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 16 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := pinned.New(pinned.Options{BudgetBytes: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	s, err := tier.New(tier.Options{Devices: cpu.Devices(devs), Host: pool})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close() // before the pool

	key := shard.Key{Chunk: 0, Rank: 0, State: shard.Param}
	if err := s.Register(key, tier.Spec{Elems: 4, DType: dtype.F32, Home: shard.Host}); err != nil {
		fmt.Println(err)
		return
	}
	if err := s.WriteHome(key, dtype.Bytes([]float32{1, 2, 3, 4})); err != nil {
		fmt.Println(err)
		return
	}
	op, err := s.Fetch(key, shard.Host, shard.HBM)
	if err == nil {
		err = op.Wait()
	}
	if err != nil {
		fmt.Println(err)
		return
	}

	l, err := s.Acquire(key, shard.HBM, shard.Read)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make([]float32, 4)
	dev := devs[0]
	dev.CopyDeviceToHost(dev.DefaultStream(), dtype.Bytes(got), l.Buffer(), 0)
	err = dev.DefaultStream().Synchronize()
	l.Release()
	fmt.Println(got, err)

	where, err := s.Where(key)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("valid in hbm:", where.Copies[shard.HBM].Valid, "host:", where.Copies[shard.Host].Valid)
	link := s.Stats().Links[shard.HostToHBM]
	fmt.Println(link.Bytes, "bytes host->hbm in", link.Moves, "move")
	// Output:
	// [1 2 3 4] <nil>
	// valid in hbm: true host: true
	// 16 bytes host->hbm in 1 move
}
