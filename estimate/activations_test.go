package estimate

import (
	"errors"
	"fmt"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// TestActivationOptionsFromConfig: the dtype follows the precision and
// strata.activation_dtype, the block count the activation_checkpointing
// block.
func TestActivationOptionsFromConfig(t *testing.T) {
	s, _ := model.Lookup("small")
	for _, c := range []struct {
		extra, strata string
		prec          gpu.DType
		want          model.ActivationOptions
	}{
		{"", "", gpu.BF16, model.ActivationOptions{DType: gpu.BF16}},
		{"", `, "activation_dtype": "fp32"`, gpu.BF16, model.ActivationOptions{DType: gpu.F32}},
		{"", "", gpu.F32, model.ActivationOptions{DType: gpu.F32}},
		{`"activation_checkpointing": {},`, "", gpu.BF16, model.ActivationOptions{DType: gpu.BF16, Checkpoint: 4}},
		{`"activation_checkpointing": {"number_checkpoints": 2, "cpu_checkpointing": true},`, "", gpu.BF16, model.ActivationOptions{DType: gpu.BF16, Checkpoint: 2, Offload: true}},
	} {
		js := fmt.Sprintf(`{"train_micro_batch_size_per_gpu": 1, %s "strata": {"model": "small"%s}}`, c.extra, c.strata)
		cfg, err := config.Parse([]byte(js), "", config.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ActivationOptionsFromConfig(cfg, s, c.prec); got != c.want {
			t.Errorf("%s %s %s: %+v, want %+v", c.extra, c.strata, c.prec, got, c.want)
		}
	}
}

// TestEstimateActivationHostBytes: with the optimizer on NVMe and a host
// budget, the saved inputs' host homes come out of the budget first: the
// optimizer state kept in host RAM shrinks by whole shards, at least by
// what the inputs take.
func TestEstimateActivationHostBytes(t *testing.T) {
	s, _ := model.Lookup("gpt2")
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{ChunkParams: ChunkParams(l), Devices: 2, Stage: 3, OptimizerTier: shard.NVMe, ParamTier: shard.NVMe, HostBudgetBytes: 4 << 30}
	kept := func(o Options) int64 {
		e, err := Memory(o)
		if err != nil {
			t.Fatal(err)
		}
		return e.TierBytes(shard.Host)
	}
	without := kept(o)
	act := model.ActivationOptions{DType: gpu.BF16, Checkpoint: s.Layers, Offload: true}
	o.ActivationHostBytes = InputHostBytes(s, 8, 1024, act)
	with := kept(o)
	// Whole shards: the room for state shrinks by the inputs' bytes, and
	// what it keeps by at least that less one shard (the largest, an fp32
	// master), which the room left over may now hold where it did not.
	largest := int64(0)
	for _, c := range o.ChunkParams {
		largest = max(largest, IOBytes(4*((c+1)/2)))
	}
	if o.ActivationHostBytes != 12*IOBytes(8*1024*768*2) || without-with < o.ActivationHostBytes-largest || with >= without {
		t.Errorf("inputs take %d B of host RAM per rank; the optimizer state kept there went from %d to %d", o.ActivationHostBytes, without, with)
	}
}

// TestCheckActivationTokens: micro-batches whose activation sizes would
// pass int64 are refused (ErrTooLarge), among them gpt-7b at 10^11 × 2048
// tokens, which printed negative sizes before; at the largest micro-batch
// accepted for each named model, every term of every way of keeping the
// activations is positive, no smaller than at half the micro-batch, and
// their sum fits: the bound is an upper bound of the arithmetic.
func TestCheckActivationTokens(t *testing.T) {
	s7, _ := model.Lookup("gpt-7b")
	if err := CheckActivationTokens(s7, 100000000000, 2048); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("gpt-7b 10^11 × 2048: %v, want ErrTooLarge", err)
	}
	if err := CheckActivationTokens(s7, 8, 2048); err != nil {
		t.Fatalf("gpt-7b 8 × 2048: %v", err)
	}
	for _, name := range model.Names() {
		s, _ := model.Lookup(name)
		lo, hi := 1, 1<<62 // the largest accepted micro lies in [lo, hi)
		for hi-lo > 1 {
			if mid := lo + (hi-lo)/2; CheckActivationTokens(s, mid, s.MaxSeq) == nil {
				lo = mid
			} else {
				hi = mid
			}
		}
		for _, o := range []model.ActivationOptions{{DType: gpu.F32}, {DType: gpu.BF16, Checkpoint: s.Layers}, {DType: gpu.BF16, Checkpoint: s.Layers, Offload: true}} {
			big, half := Activations(s, lo, s.MaxSeq, o), Activations(s, max(lo/2, 1), s.MaxSeq, o)
			var sum []int64
			for i, term := range big.AllTerms() {
				if term.Bytes < 0 || term.Bytes < half.AllTerms()[i].Bytes {
					t.Errorf("%s %d × %d %v: %s %d bytes (at half the micro-batch %d): wrapped", name, lo, s.MaxSeq, o, term.Name, term.Bytes, half.AllTerms()[i].Bytes)
				}
				sum = append(sum, term.Bytes)
			}
			if total, ok := units.Add(append(sum, big.HostInputBytes)...); !ok || total != big.DeviceBytes()+big.HostInputBytes {
				t.Errorf("%s %d × %d %v: the terms' sum wraps", name, lo, s.MaxSeq, o)
			}
		}
	}
}
