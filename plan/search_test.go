package plan

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// TestComputePlacement: the compute is measured in the first placement
// that fits without NVMe, else the narrow state's, else the first.
func TestComputePlacement(t *testing.T) {
	mk := func(fits bool, opt, params shard.Tier, moments string) Prediction {
		return Prediction{Config: Config{Optimizer: opt, Params: params, Moments: moments}, Fits: fits}
	}
	fits := []Prediction{
		mk(false, shard.HBM, shard.HBM, fp32State),
		mk(true, shard.NVMe, shard.Host, fp32State),
		mk(true, shard.NVMe, shard.Host, NarrowMoments),
		mk(true, shard.Host, shard.Host, NarrowMoments),
	}
	if got := computePlacement(fits, 1); got != 3 {
		t.Errorf("host placement fits: got %d, want 3", got)
	}
	if got := computePlacement(fits[:3], 1); got != 2 {
		t.Errorf("NVMe only: got %d, want the narrow one, 2", got)
	}
	if got := computePlacement(fits[:2], 1); got != 1 {
		t.Errorf("one NVMe placement: got %d, want 1", got)
	}
}

// TestFitCountsCPUDevicesInRAM: on the CPU backend the devices' memory is
// host RAM, so a placement fits only if its devices and its host state
// fit the RAM together (a gpt-2b placement that fit the host's state
// alone was killed by the kernel at 24 GB).
func TestFitCountsCPUDevicesInRAM(t *testing.T) {
	in := inputs(t, "gpt2")
	in.NVMePath = ""
	preds, err := Fit(in)
	if err != nil {
		t.Fatal(err)
	}
	var host Prediction
	for _, pr := range preds {
		if pr.Name == "stage 3, params and optimizer on host" {
			host = pr
		}
	}
	in.HostBytes = host.HostBytes + host.DeviceBytes/2 // the host state fits, not the devices beside it
	for _, shared := range []bool{false, true} {
		in.SharedCores = shared
		preds, err := Fit(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, pr := range preds {
			if pr.Name != host.Name {
				continue
			}
			if pr.Fits == shared || shared && !strings.Contains(pr.Short, "of it the CPU backend's device memory") {
				t.Errorf("shared cores %v: fits %v, short %q", shared, pr.Fits, pr.Short)
			}
		}
	}
}

// TestFitHostIsEnginePool: a placement's host bytes are the pinned pool
// its engine makes (homes, staging and spare room, and a quarter more
// where shards come and go), not its homes alone — gpt2-774m's host
// placement pinned 8.63 GiB for 5.88 GiB of homes — and on the CPU
// backend, with offloaded params, the device fill counted against the RAM
// bounds what each device took (the tier store takes what is left of it
// for param shards; the rest is the estimate's device bytes).
func TestFitHostIsEnginePool(t *testing.T) {
	in := inputs(t, "small")
	// Deep and narrow: the tier store's room for every param shard in
	// "HBM" is several times the two the estimate's working set counts.
	in.Model, in.Shape.Layers = "small-deep", 24
	in.NVMePath, in.HBMBytes = t.TempDir(), 64*units.MiB
	lookup := func(string) (config.Shape, error) { return config.Shape(in.Shape), nil }
	preds, err := Fit(in)
	if err != nil {
		t.Fatal(err)
	}
	homesLess := false
	for _, pr := range preds {
		if !pr.Fits || pr.Optimizer == shard.HBM || pr.Checkpoint {
			continue
		}
		cfg, err := config.Parse([]byte(ConfigJSON(pr.Config, in)), "json", config.Options{LookupShape: lookup})
		if err != nil {
			t.Fatal(err)
		}
		devs, err := backend.Open("cpu", in.Devices, in.HBMBytes, true)
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(cfg, devs.Devs, devs.Comms, engine.Options{HostRegistrar: devs.Registrar, Collectives: devs.Collectives})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		s := e.Summary()
		e.Close()
		devs.Close()
		// Within 1 %: the engine rounds each shard's home up to 4 KiB
		// (IOAlignBytes), the estimate each tier's total; "small" has 42
		// shards a state of a few KiB to a MiB (at gpt2-774m both are 8.63 GiB).
		if s.Tier == nil || math.Abs(float64(s.Tier.PinnedPoolBytes-pr.HostBytes)) > 0.01*float64(s.Tier.PinnedPoolBytes) {
			t.Errorf("%s: fit counts %d host bytes, the engine pinned %+v", pr.Name, pr.HostBytes, s.Tier)
			continue
		}
		o := pr.optOptions()
		o.Devices, o.Stage, o.OptimizerTier, o.ParamTier = in.Devices, pr.Stage, pr.Optimizer, pr.Params
		l, _ := model.NewLayout(in.Shape)
		o.ChunkParams, o.ShardAlignElems = estimate.ChunkParams(l), estimate.DefaultShardAlignElems
		st, err := estimate.Memory(o)
		if err != nil {
			t.Fatal(err)
		}
		homesLess = homesLess || st.HostBytes() < pr.HostBytes
		if fill, peak := deviceFill(st, &pr, in), s.PerDevice[0].PeakBytes; pr.Params != shard.HBM && float64(fill) < 0.99*float64(peak) {
			t.Errorf("%s: the fit counts %d bytes of each CPU device, it took %d", pr.Name, fill, peak)
		}
	}
	if !homesLess {
		t.Error("no placement's pool is more than its homes: the test checks nothing the homes would not")
	}
}

// TestProbeNVMeKept: the NVMe probe records what the tier store kept in
// host RAM between steps under the kept bytes of the probed placement's
// state precision, within what diskBytes counts; a small model's narrow
// state, a third of its fp32 state in the same staging room, is kept at
// least as much (measured: all of it, against 38 % of the fp32 reads).
func TestProbeNVMeKept(t *testing.T) {
	in := inputs(t, "small")
	in.NVMePath = t.TempDir()
	preds, err := Fit(in)
	if err != nil {
		t.Fatal(err)
	}
	find := func(name string) Prediction {
		for _, pr := range preds {
			if pr.Name == name && pr.Fits {
				return pr
			}
		}
		t.Fatalf("no placement %q fits", name)
		return Prediction{}
	}
	full := find("stage 3, optimizer on NVMe, params on host")
	narrow := find("stage 3, optimizer on NVMe, params on host" + narrowName)
	w, err := workOf(in)
	if err != nil {
		t.Fatal(err)
	}
	disk := Disk{Path: in.NVMePath, ReadBytesPerS: 1e9, WriteBytesPerS: 1e9}
	var cm Compute
	if err := ProbeNVMe(context.Background(), &cm, full, &narrow, in, "cpu", disk); err != nil {
		t.Fatal(err)
	}
	fr, fw, _ := diskBytes(&full, in, w)
	nr, nw, _ := diskBytes(&narrow, in, w)
	if cm.NVMeKeptReadBytes < 0 || cm.NVMeKeptReadBytes > fr || cm.NVMeKeptWriteBytes < 0 || cm.NVMeKeptWriteBytes > fw ||
		cm.NarrowKeptReadBytes <= 0 || cm.NarrowKeptReadBytes > nr || cm.NarrowKeptWriteBytes < 0 || cm.NarrowKeptWriteBytes > nw ||
		cm.NarrowKeptReadBytes/nr < cm.NVMeKeptReadBytes/fr {
		t.Errorf("kept: fp32 %v of %v read, %v of %v written; narrow %v of %v, %v of %v: want each within its modelled bytes, the narrow state's reads kept, at least the fp32 state's share",
			cm.NVMeKeptReadBytes, fr, cm.NVMeKeptWriteBytes, fw, cm.NarrowKeptReadBytes, nr, cm.NarrowKeptWriteBytes, nw)
	}
	// A narrow placement probed alone fills the narrow figures only.
	cm = Compute{NVMeKeptReadBytes: 1}
	if err := ProbeNVMe(context.Background(), &cm, narrow, nil, in, "cpu", disk); err != nil {
		t.Fatal(err)
	}
	if cm.NVMeKeptReadBytes != 0 || cm.NarrowKeptReadBytes <= 0 {
		t.Errorf("narrow alone: fp32 kept %v (want 0), narrow %v (want its own)", cm.NVMeKeptReadBytes, cm.NarrowKeptReadBytes)
	}
}
