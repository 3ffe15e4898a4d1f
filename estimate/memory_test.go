package estimate

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

func mustEstimate(t *testing.T, o Options) ModelState {
	t.Helper()
	e, err := Memory(o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The reference text's example: Ψ = 7.5B on N = 64 devices gives 120 GB,
// 31.4 GB, 16.6 GB and 1.9 GB per device for stages 0-3. With one chunk
// divisible by N and no alignment the bytes are exact.
func TestReferenceFormulas(t *testing.T) {
	const psi = 7_500_000_000
	want := []struct {
		bytes   int64
		rounded string
		formula string
	}{
		{120_000_000_000, "120.0", "16Ψ"},
		{31_406_250_000, "31.4", "4Ψ + 12Ψ/N"},
		{16_640_625_000, "16.6", "2Ψ + 14Ψ/N"},
		{1_875_000_000, "1.9", "16Ψ/N"},
	}
	for _, s := range Stages(Options{ChunkParams: []int64{psi}, Devices: 64, ShardAlignElems: 1}) {
		if s.Err != nil {
			t.Fatalf("stage %d: %v", s.Stage, s.Err)
		}
		w := want[s.Stage]
		got := s.DeviceBytes()
		if got != w.bytes {
			t.Errorf("stage %d: %d bytes per device, want %d", s.Stage, got, w.bytes)
		}
		if r := fmt.Sprintf("%.1f", float64(got)/1e9); r != w.rounded {
			t.Errorf("stage %d: %s GB, want %s GB", s.Stage, r, w.rounded)
		}
		f := s.TierFormula(shard.HBM)
		if f.String() != w.formula {
			t.Errorf("stage %d: formula %q, want %q", s.Stage, f, w.formula)
		}
		if f.Bytes(psi, psi, 64) != float64(got) {
			t.Errorf("stage %d: formula gives %v, estimate %d", s.Stage, f.Bytes(psi, psi, 64), got)
		}
		if s.HostBytes() != 0 || s.NVMeBytes() != 0 {
			t.Errorf("stage %d: host %d nvme %d with nothing offloaded", s.Stage, s.HostBytes(), s.NVMeBytes())
		}
	}
}

// TestChunkParams: the layout's chunks are the shape's arithmetic (the
// embeddings, L blocks, the final chunk, a mixture of experts' experts)
// and sum to Ψ.
func TestChunkParams(t *testing.T) {
	for _, name := range model.Names() {
		s, _ := model.Lookup(name)
		got := chunkParams(t, s)
		want := []int64{s.EmbeddingParamCount()}
		for l := range s.Layers {
			want = append(want, s.BlockChunkParamCount(l))
		}
		want = append(want, s.FinalParamCount())
		for range s.SparseLayers() * s.Experts {
			want = append(want, s.ExpertParamCount())
		}
		var sum int64
		for _, c := range got {
			sum += c
		}
		if !slices.Equal(got, want) || sum != s.ParamCount() {
			t.Errorf("%s: chunks %v sum to %d, want %v summing to %d", name, got, sum, want, s.ParamCount())
		}
	}
}

// chunkParams is ChunkParams of s's layout.
func chunkParams(t testing.TB, s model.Shape) []int64 {
	t.Helper()
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	return ChunkParams(l)
}

func TestShardElems(t *testing.T) {
	cases := []struct{ chunk, n, align, want int64 }{
		{10240, 4, 2048, 4096}, {12704, 4, 2048, 4096}, {64, 4, 2048, 2048}, {64, 4, 1, 16},
		{65, 4, 1, 17}, {8192, 4, 2048, 2048}, {8193, 4, 2048, 4096}, {7, 1, 1, 7}, {7, 1, 4, 8},
	}
	for _, c := range cases {
		if got := ShardElems(c.chunk, int(c.n), c.align); got != c.want {
			t.Errorf("ShardElems(%d, %d, %d) = %d, want %d", c.chunk, c.n, c.align, got, c.want)
		}
	}
}

// The tiny shape worked by hand, N = 4, alignment 2048: chunk 0 has
// (256+64)·32 = 10240 params, the two blocks 12·32²+13·32 = 12704, the final
// layernorm 64; Ψ = 35712. Shards: 2560 -> 4096, 3176 -> 4096, 16 -> 2048,
// so each rank owns 14336 elements and a gathered copy is 57344.
func TestPaddingTiny(t *testing.T) {
	s, _ := model.Lookup("tiny")
	want := []int64{
		16 * 57344,         // stage 0: everything replicated
		4*57344 + 12*14336, // stage 1
		2*57344 + 14*14336, // stage 2
		16 * 14336,         // stage 3
	}
	for _, st := range Stages(Options{ChunkParams: chunkParams(t, s), Devices: 4, ShardAlignElems: 2048}) {
		if st.Params != 35712 || st.RankElems != 14336 || st.PaddedElems != 57344 {
			t.Fatalf("Ψ %d rank %d padded %d", st.Params, st.RankElems, st.PaddedElems)
		}
		if got := st.DeviceBytes(); got != want[st.Stage] {
			t.Errorf("stage %d: %d bytes, want %d", st.Stage, got, want[st.Stage])
		}
	}
}

// Padding adds at most one alignment unit per chunk and rank: the estimate
// is never below the formula and never above it by more than that, and for
// a real model it is within 0.1 % of the formula.
func TestPaddingBounds(t *testing.T) {
	for _, name := range []string{"tiny", "small", "gpt2", "gpt2-1.5b"} {
		s, _ := model.Lookup(name)
		chunks := chunkParams(t, s)
		for _, n := range []int{1, 2, 3, 4, 8} {
			for _, st := range Stages(Options{ChunkParams: chunks, Devices: n}) {
				formula := st.TierFormula(shard.HBM).Bytes(st.Params, st.Params, n)
				got := float64(st.DeviceBytes())
				slack := float64(16 * int64(len(chunks)) * int64(n) * DefaultShardAlignElems)
				if got < formula-1e-6 || got > formula+slack {
					t.Errorf("%s N=%d stage %d: %v bytes, formula %v, slack %v", name, n, st.Stage, got, formula, slack)
				}
				if name == "gpt2" || name == "gpt2-1.5b" {
					if r := got / formula; r > 1.001 {
						t.Errorf("%s N=%d stage %d: padding adds %.3f%%", name, n, st.Stage, (r-1)*100)
					}
				}
			}
		}
	}
}

// ZeRO-Offload and ZeRO-Infinity placements, per rank and for the machine.
func TestOffload(t *testing.T) {
	chunks := []int64{1 << 20, 1 << 20} // divisible, so padding is zero
	const n = 4
	r := int64(2 << 20 / n) // elements per rank
	full := int64(2 << 20)

	// Stage 2, optimizer on the host: the device keeps 2Ψ params and 2Ψ/N
	// grads; the host 12Ψ/N per rank plus the bf16 grad shard.
	e := mustEstimate(t, Options{ChunkParams: chunks, Devices: n, Stage: 2, OptimizerTier: shard.Host})
	if e.DeviceBytes() != 2*full+2*r || e.TierBytes(shard.Host) != 14*r || e.HostBytes() != n*14*r || e.NVMeBytes() != 0 {
		t.Errorf("stage 2 cpu: device %d host %d nvme %d", e.DeviceBytes(), e.HostBytes(), e.NVMeBytes())
	}
	if f := e.TierFormula(shard.HBM).String(); f != "2Ψ + 2Ψ/N" {
		t.Errorf("device formula %q", f)
	}
	if f := e.TierFormula(shard.Host).String(); f != "14Ψ/N" {
		t.Errorf("host formula %q", f)
	}
	// fp32 host gradients.
	e = mustEstimate(t, Options{ChunkParams: chunks, Devices: n, Stage: 1, OptimizerTier: shard.Host, HostGradDType: dtype.F32})
	if e.DeviceBytes() != 4*full || e.TierBytes(shard.Host) != 16*r {
		t.Errorf("stage 1 cpu f32 grads: device %d host/rank %d", e.DeviceBytes(), e.TierBytes(shard.Host))
	}
	// Stage 3, params and optimizer on the host: only the grad shard stays.
	e = mustEstimate(t, Options{ChunkParams: chunks, Devices: n, Stage: 3, OptimizerTier: shard.Host, ParamTier: shard.Host})
	if e.DeviceBytes() != 2*r || e.TierBytes(shard.Host) != 16*r {
		t.Errorf("stage 3 cpu/cpu: device %d host/rank %d", e.DeviceBytes(), e.TierBytes(shard.Host))
	}
	// Stage 3, everything on NVMe (ZeRO-Infinity): the gradient shard
	// leaves the device too; without a host budget its home is the host.
	e = mustEstimate(t, Options{ChunkParams: chunks, Devices: n, Stage: 3, OptimizerTier: shard.NVMe, ParamTier: shard.NVMe, MasterDType: dtype.F32})
	if e.DeviceBytes() != 0 || e.TierBytes(shard.Host) != 2*r || e.TierBytes(shard.NVMe) != 14*r {
		t.Errorf("stage 3 nvme/nvme: device %d host %d nvme %d per rank", e.DeviceBytes(), e.TierBytes(shard.Host), e.TierBytes(shard.NVMe))
	}
	// A host budget keeps part of the model state in RAM, after the
	// staging room (TierReadAhead chunks of master, m, v and
	// TierReadAhead+1 gradient shards): master first, then m, then v,
	// then the gradient shards (the optimizer state moves inside the next
	// forward when it is on NVMe, a gradient in the backward: keepInHost).
	staging := int64(TierReadAhead*3*4*(1<<20/n) + (TierReadAhead+1)*2*(1<<20/n))
	spare := int64(4 * (1 << 20 / n))
	budget := int64(n) * (13*r + staging + spare) * 5 / 4 // the store's 4/5 per rank: staging, spare, then 13r bytes = master, m, v (12r) + one gradient shard (r)
	e = mustEstimate(t, Options{ChunkParams: chunks, Devices: n, Stage: 3, OptimizerTier: shard.NVMe, HostBudgetBytes: budget, MasterDType: dtype.F32})
	if e.HostStagingPerRank != staging || e.PerRank[shard.Master][shard.Host] != 4*r || e.PerRank[shard.AdamM][shard.Host] != 4*r ||
		e.PerRank[shard.AdamV][shard.Host] != 4*r || e.PerRank[shard.Grad][shard.Host] != r || e.PerRank[shard.Grad][shard.NVMe] != r ||
		!e.HostKept[shard.Grad][0] || e.HostKept[shard.Grad][1] || e.NVMeBytes() != int64(n)*r || e.HostBytes() != int64(n)*13*r {
		t.Errorf("budget split: staging %d, %v", e.HostStagingPerRank, e.PerRank)
	}
	// One that holds a single master shard keeps no gradient: the second
	// master shard does not fit, and neither does a gradient shard (a
	// chunk's shard is r/2 elements: 2r bytes of master, r of gradient).
	e = mustEstimate(t, Options{ChunkParams: chunks, Devices: n, Stage: 3, OptimizerTier: shard.NVMe, HostBudgetBytes: int64(n) * (2*r + r/2 + staging + spare) * 5 / 4, MasterDType: dtype.F32})
	if e.PerRank[shard.Master][shard.Host] != 2*r || e.PerRank[shard.Grad][shard.Host] != 0 || e.PerRank[shard.Grad][shard.NVMe] != 2*r ||
		!e.HostKept[shard.Master][0] || e.HostKept[shard.Master][1] || e.HostKept[shard.Grad][0] {
		t.Errorf("master kept, gradients spilled: %v", e.PerRank)
	}
	if len(e.Notes) != 1 {
		t.Errorf("notes %q", e.Notes)
	}
	// The same budget with the optimizer on the host is exceeded: noted.
	e = mustEstimate(t, Options{ChunkParams: chunks, Devices: n, Stage: 3, OptimizerTier: shard.Host, HostBudgetBytes: int64(n) * 6 * r})
	if len(e.Notes) != 1 || e.TierBytes(shard.Host) != 14*r {
		t.Errorf("over budget: notes %q host %d", e.Notes, e.TierBytes(shard.Host))
	}
}

// Stage 3 chunks below the persistence threshold stay gathered on the device.
func TestPersistence(t *testing.T) {
	s, _ := model.Lookup("tiny")
	e := mustEstimate(t, Options{ChunkParams: chunkParams(t, s), Devices: 4, Stage: 3, ParamTier: shard.Host, PersistenceThreshold: 100_000})
	if e.PersistentElems != e.PaddedElems || e.PerRank[shard.Param][shard.HBM] != 2*e.PaddedElems || e.PerRank[shard.Param][shard.Host] != 0 {
		t.Errorf("all chunks persistent: %d of %d, params hbm %d host %d", e.PersistentElems, e.PaddedElems, e.PerRank[shard.Param][shard.HBM], e.PerRank[shard.Param][shard.Host])
	}
	// Only the final layernorm (64 params) is below 100.
	e = mustEstimate(t, Options{ChunkParams: chunkParams(t, s), Devices: 4, Stage: 3, PersistenceThreshold: 100, ShardAlignElems: 2048})
	if e.PersistentElems != 4*2048 || e.PerRank[shard.Param][shard.HBM] != 2*(4*2048+4096*3) {
		t.Errorf("final layernorm persistent: %d, params %d", e.PersistentElems, e.PerRank[shard.Param][shard.HBM])
	}
	// Without padding the device holds the formula (16Ψ/N) plus the other
	// ranks' parts of ln_f: 2 B × 64 × 3/4 = 96 B.
	e = mustEstimate(t, Options{ChunkParams: []int64{4096, 4096, 64}, Devices: 4, Stage: 3, PersistenceThreshold: 100, ShardAlignElems: 1})
	if e.PersistentBytes != 96 || e.PaddingBytes() != 0 || e.DeviceBytes() != e.FormulaDeviceBytes()+96 || e.FormulaDeviceBytes() != 16*(4096+4096+64)/4 {
		t.Errorf("persistent %d padding %d device %d formula %d", e.PersistentBytes, e.PaddingBytes(), e.DeviceBytes(), e.FormulaDeviceBytes())
	}
}

func TestInvalidOptions(t *testing.T) {
	cases := []struct {
		o    Options
		want string
	}{
		{Options{ChunkParams: []int64{10}, Devices: 2, Stage: 0, OptimizerTier: shard.Host},
			"engine: estimate: offload_optimizer cpu needs stage 1, 2 or 3 (the optimizer state is sharded from stage 1 on)"},
		{Options{ChunkParams: []int64{10}, Devices: 2, Stage: 2, ParamTier: shard.NVMe},
			"engine: estimate: offload_param nvme needs stage 3 (parameters are sharded only at stage 3)"},
		{Options{ChunkParams: []int64{10}, Devices: 0}, "engine: estimate: 0 devices: need at least 1"},
		{Options{ChunkParams: []int64{10}, Devices: 1, Stage: 4}, "engine: estimate: stage 4 is not 0, 1, 2 or 3"},
		{Options{Devices: 1}, "engine: estimate: no chunks"},
	}
	for _, c := range cases {
		if _, err := Memory(c.o); err == nil || err.Error() != c.want {
			t.Errorf("got %v, want %s", err, c.want)
		}
	}
	st := Stages(Options{ChunkParams: []int64{10}, Devices: 2, OptimizerTier: shard.Host})
	if st[0].Err == nil || st[1].Err != nil {
		t.Errorf("stages with cpu offload: %v / %v", st[0].Err, st[1].Err)
	}
}

func TestOptionsFromConfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "configs", "good_zero_infinity_nvme.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(data, "", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := model.Lookup("gpt-2b")
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	o, err := OptionsFromConfig(c, l)
	if err != nil {
		t.Fatal(err)
	}
	if o.Stage != 3 || o.Devices != 2 || o.OptimizerTier != shard.NVMe || o.ParamTier != shard.NVMe || o.HostBudgetBytes != 8<<30 || o.PersistenceThreshold != 100_000 {
		t.Errorf("options %+v", o)
	}
	e := mustEstimate(t, o)
	// About 2B params: 14.125Ψ = 28.5 GB of model state (bf16 params and
	// gradients, the master's 2.125 B remainder beside the param, fp32 m
	// and v: config.MasterFormat's default with the optimizer on NVMe),
	// none of it on the device but the persistent ln_f (ZeRO-Infinity
	// offloads the gradient shard too).
	if o.StateDType(shard.Master) != dtype.Rem16 {
		t.Errorf("master %s with the optimizer on NVMe, want the remainder", o.StateDType(shard.Master))
	}
	if total := e.DeviceBytes()*2 + e.HostBytes() + e.NVMeBytes(); e.DeviceBytes() != 2*e.PersistentElems || total < 14125*e.Params/1000 || total > 14125*e.Params/1000*1001/1000 {
		t.Errorf("total model state %d for Ψ=%d", total, e.Params)
	}
}

// TestCheckSizeOverflow: an alignment or a device count that pads the
// model state past int64 is refused by Memory (ErrTooLarge), where it
// wrapped to 0 bytes before; gpt-7b with the defaults passes.
func TestCheckSizeOverflow(t *testing.T) {
	l, err := model.NewLayout(mustShape(t, "gpt-7b"))
	if err != nil {
		t.Fatal(err)
	}
	o := Options{ChunkParams: ChunkParams(l), Devices: 8, Stage: 3}
	if _, err := Memory(o); err != nil {
		t.Fatalf("gpt-7b on 8 devices: %v", err)
	}
	for _, c := range []struct {
		devices int
		align   int64
	}{{1, 1 << 62}, {1, math.MaxInt64}, {1 << 40, 1 << 30}} {
		o.Devices, o.ShardAlignElems = c.devices, c.align
		if _, err := Memory(o); !errors.Is(err, ErrTooLarge) {
			t.Errorf("%d devices, align %d: %v, want ErrTooLarge", c.devices, c.align, err)
		}
	}
}

func mustShape(t *testing.T, name string) model.Shape {
	t.Helper()
	s, err := model.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
