package lptmp

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/shard"
)

// Alternating step times of a few placements in one process.
func TestPlacements(t *testing.T) {
	name := os.Getenv("LP_MODEL")
	s, _ := model.Lookup(name)
	seq, _ := strconv.Atoi(os.Getenv("LP_SEQ"))
	in := plan.Inputs{Model: name, Shape: s, Devices: 1, Batch: 1, Seq: seq, HBMBytes: 8 << 30, NVMePath: "/var/tmp/sb", SharedCores: true}
	cs := []plan.Config{
		{Name: "s1 host fp32", Stage: 1, Optimizer: shard.Host, Params: shard.HBM, Moments: "fp32", Master: "fp32"},
		{Name: "s3 host fp32", Stage: 3, Optimizer: shard.Host, Params: shard.HBM, Moments: "fp32", Master: "fp32"},
		{Name: "s3 host int8", Stage: 3, Optimizer: shard.Host, Params: shard.HBM, Moments: "int8", Master: "bf16+remainder"},
		{Name: "s3 host/params host int8", Stage: 3, Optimizer: shard.Host, Params: shard.Host, Moments: "int8", Master: "bf16+remainder"},
		{Name: "s3 nvme/params host int8", Stage: 3, Optimizer: shard.NVMe, Params: shard.Host, Moments: "int8", Master: "bf16+remainder"},
	}
	for r := range 2 {
		for _, c := range cs {
			secs, err := plan.TimeConfig(context.Background(), c, in, "cpu", 2, 3)
			t.Log(r, c.Name, secs, err)
		}
	}
}
