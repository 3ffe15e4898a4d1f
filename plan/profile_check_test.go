package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProfileValidate: a profile whose figures no measurement gives (1e308
// GB/s, a negative or zero time, a zero rate in an entry, a rate beyond
// any machine) is refused at Load, naming the file and the key and saying
// how to measure again, before a placement is ranked by it; the figures a
// probe leaves at 0 (not measured) and every real figure load.
func TestProfileValidate(t *testing.T) {
	m := Machine{CPU: "AMD EPYC", CPUs: 2, RAMBytes: 24 << 30, Backend: "cpu", Device: "cpu:0"}
	good := func() *Profile {
		p := testProfile(m)
		p.SetCompute(Compute{Model: "tiny", Devices: 1, Batch: 2, Seq: 64, Params: 35712, FwdBwdSeconds: 0.1, DeviceAdamSeconds: 0.01})
		return p
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "profile.json")
	if err := good().Save(path); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("a measured profile: %v", err)
	}
	unmeasured := NewProfile(m)
	if err := unmeasured.Validate(); err != nil {
		t.Fatalf("an empty profile (nothing measured yet): %v", err)
	}
	for _, c := range []struct {
		edit func(p *Profile)
		want string
	}{
		{func(p *Profile) { p.CopyBytesPerS = 1e308 }, "copy_bytes_per_s 1e+308 is not a measured figure (want above 0 and at most 1e+15 bytes/s)"},
		{func(p *Profile) { p.AdamParamsPerS = -1e9 }, "adam_params_per_s -1e+09 is not a measured figure"},
		{func(p *Profile) { p.Disks[0].ReadBytesPerS = 5e15 }, "disks[0].read_bytes_per_s 5e+15 is not a measured figure"},
		{func(p *Profile) { p.Disks[0].WriteBytesPerS = 0 }, "disks[0].write_bytes_per_s 0 is not a measured figure"},
		{func(p *Profile) { p.AdamStates[0].ParamsPerS = -5 }, "adam_states[0].params_per_s -5 is not a measured figure"},
		{func(p *Profile) { p.Computes[0].FwdBwdSeconds = -0.1 }, "computes[0].fwd_bwd_s -0.1 is not a measured figure (want from 1e-09 to 1e+06 s)"},
		{func(p *Profile) { p.Computes[0].FwdBwdSeconds = 0 }, "computes[0].fwd_bwd_s 0 is not a measured figure"},
		{func(p *Profile) { p.Computes[0].DeviceAdamSeconds = 1e-300 }, "computes[0].device_adam_s 1e-300 is not a measured figure"},
		{func(p *Profile) { p.Computes[0].Seq = 0 }, "computes[0]: devices 1, batch 2 and seq 0 must be at least 1"},
	} {
		p := good()
		c.edit(p)
		if err := p.Save(path); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), "plan: profile "+path+": "+c.want) || !strings.Contains(err.Error(), "strata plan --probe") {
			t.Errorf("got %v\nwant %q and how to measure again", err, c.want)
		}
	}
	// A figure JSON cannot hold as a float64 is the same one error.
	if err := os.WriteFile(path, []byte(`{"version": 1, "copy_bytes_per_s": 1e400}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "plan: profile "+path+": ") || !strings.Contains(err.Error(), "strata plan --probe") {
		t.Errorf("1e400: %v", err)
	}
}
