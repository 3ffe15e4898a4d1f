package timeline_test

import (
	"fmt"
	"time"

	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/timeline"
)

// ExampleOverlap computes a step's exposed transfer time from a timeline's
// events: a 10 ms step, an NVMe read from 2 to 6 ms and rank 0 waiting for
// a shard from 4 to 8 ms. The wait overlaps the read for 2 ms, so half of
// the transfer time was not hidden.
func ExampleOverlap() {
	ms := time.Millisecond
	events := []timeline.Event{
		{Name: "step 1", Cat: timeline.CatStep, Phase: 'X', Step: 1, Start: 0, Dur: 10 * ms, Rank: -1},
		{Name: "read", Cat: timeline.CatMove, Phase: 'X', Start: 2 * ms, Dur: 4 * ms, Rank: -1,
			Link: shard.NVMeToHost, Bytes: 8 << 20},
		{Name: "wait", Cat: timeline.CatStall, Phase: 'X', Start: 4 * ms, Dur: 4 * ms, Rank: 0},
	}
	for _, o := range timeline.Overlap(events) {
		fmt.Println("step", o.Step, "stall", o.StallMax, "transfer", o.TransferBusy,
			"exposed", o.Exposed, o.ExposedFraction)
		fmt.Println("nvme->host bytes", o.LinkBytes[shard.NVMeToHost])
	}
	// Output:
	// step 1 stall 4ms transfer 4ms exposed 2ms 0.5
	// nvme->host bytes 8388608
}
