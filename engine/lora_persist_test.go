package engine

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// TestLoRACodedBaseSmallChunks: strata.lora.base_dtype nf4 (and int8) on
// a model whose every chunk is below the default
// stage3_param_persistence_threshold (1e5) still stores the frozen base
// coded in its offload tier: the base chunks are not kept gathered (the
// threshold keeps the small adapter chunks only), the run trains bit for
// bit as a bf16 base started from the quantized and decoded weights, and
// its losses are not those of the plain bf16 base; the summary files only
// the adapters as persistent, and the host holds the base's codes.
// Before, the threshold kept every chunk gathered in bf16 on the devices:
// the base was never quantized (losses bit-identical to bf16) while the
// estimate said "nf4 in host".
func TestLoRACodedBaseSmallChunks(t *testing.T) {
	const steps, n = 3, 2
	s := freezeSpec{stage: 3, n: n, opt: "cpu", param: "cpu"}
	js := s.configJSON(t)
	small := strings.Replace(js, `"stage3_param_persistence_threshold": 1000, `, ``, 1) // the default, 1e5
	if small == js {
		t.Fatal("the test config has no persistence threshold to remove")
	}
	plain := runFrozenJSON(t, withStrata(small, loraKeys), n, steps, nil)
	for _, c := range []struct {
		base string
		dt   dtype.DType
	}{{"nf4", dtype.NF4}, {"int8", dtype.INT8}} {
		t.Run(c.base, func(t *testing.T) {
			keys := strings.Replace(loraKeys, `"dropout": 0.1,`, `"dropout": 0.1, "base_dtype": "`+c.base+`",`, 1)
			got := runFrozenJSON(t, withStrata(small, keys), n, steps, nil)
			e := got.e
			l := e.layout
			if e.cfg.ZeRO.Stage3ParamPersistenceThreshold != 100_000 {
				t.Fatalf("persistence threshold %d, want the default", e.cfg.ZeRO.Stage3ParamPersistenceThreshold)
			}
			var wantPersistent, wantCoded int64
			shards := make([]int, len(l.Chunks))
			for ch := range l.Chunks {
				p := e.chunks[ch]
				shards[ch] = p.shard
				if l.Chunks[ch].Len >= 100_000 {
					t.Fatalf("chunk %d has %d params: not below the default threshold", ch, l.Chunks[ch].Len)
				}
				if l.IsAdapter(ch) {
					if !p.persistent {
						t.Errorf("adapter chunk %d (%s) is not persistent", ch, l.Chunks[ch].Name)
					}
					wantPersistent += 2 * int64(l.Chunks[ch].Len) * (n - 1) / n
					continue
				}
				if p.persistent || !p.tiered || e.paramCode(ch) != c.dt {
					t.Errorf("base chunk %d (%s): persistent %t, tiered %t, stored %v; want sharded in host RAM as %s", ch, l.Chunks[ch].Name, p.persistent, p.tiered, e.paramCode(ch), c.dt)
				}
				wantCoded += int64(c.dt.Bytes(p.shard))
			}
			for i, d := range e.Summary().PerDevice {
				if d.PersistentBytes != wantPersistent {
					t.Errorf("device %d: persistent %d bytes, want %d (the adapter chunks only)", i, d.PersistentBytes, wantPersistent)
				}
			}
			if h := e.estimate.PerRank[shard.Param][shard.Host]; h < wantCoded {
				t.Errorf("the estimate's params in host RAM: %d bytes per rank, want the base's %d bytes of %s codes and more", h, wantCoded, c.base)
			}

			devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := startEngine(t, testConfig(t, withStrata(small, loraKeys)), cpu.Devices(devs), comms,
				Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Init: codedSource{l, e.cfg.Strata.Seed, shards, c.dt}})
			if err != nil {
				t.Fatal(err)
			}
			differ := false
			for i := range steps {
				st, err := ref.Step()
				if err != nil {
					t.Fatal(err)
				}
				if got.res.losses[i] != st.Loss {
					t.Errorf("step %d: loss %v with the %s base, %v with its decoded values in bf16", i, got.res.losses[i], c.base, st.Loss)
				}
				differ = differ || got.res.losses[i] != plain.res.losses[i]
			}
			if !differ {
				t.Errorf("losses %v with the %s base are the bf16 base's: it was not quantized", got.res.losses, c.base)
			}
		})
	}
}
