package shard_test

import (
	"fmt"

	"github.com/strata-ai/strata/shard"
)

// Example names the tiers a DeepSpeed config offloads to, and a move a
// planner could hand a store: it reads rank 1's Adam moment of chunk 3 from
// NVMe into host memory, over the link that NVMe reads use.
func Example() {
	for _, name := range []string{"none", "cpu", "nvme"} {
		t, err := shard.ParseTier(name)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(name, "=", t)
	}

	m := shard.Move{
		Key:       shard.Key{Chunk: 3, Rank: 1, State: shard.AdamM},
		From:      shard.NVMe,
		To:        shard.Host,
		SizeBytes: 4 << 20,
		Reason:    shard.Prefetch,
	}
	link, ok := m.Link()
	fmt.Println(m.Key.State, m.Reason, link, ok, m.Instant())
	// Output:
	// none = hbm
	// cpu = host
	// nvme = nvme
	// adam_m prefetch nvme->host true false
}
