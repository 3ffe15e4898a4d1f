package tier

import (
	"strings"
	"testing"
)

// TestPlanBudgets covers each branch of the budget arithmetic: no param in
// HBM, the HBM share from what is left, the override, the two errors of
// HBM, the room for saved block inputs and its error, the host budget derived from the homes, the strata.host_budget case
// and its error with and without the NVMe hint.
func TestPlanBudgets(t *testing.T) {
	const k = 4096
	host := Sizes{Ranks: 2, HomeBytes: 10 * k, StagingBytes: 3 * k, SpareBytes: k}
	params := host
	params.HBMFreeBytes, params.ParamBytes, params.MaxParamBytes = 100*k, 8*k, 2*k
	with := func(s Sizes, f func(*Sizes)) Sizes { f(&s); return s }
	// Without a host budget: host = 2·(10+3+1) = 28k, pool = 28k + 7k + 4k.
	derived := Budgets{HostBytes: 28 * k, PlanHostBytes: 13 * k, PoolBytes: 39 * k}
	withHBM := func(b Budgets, hbm int64) Budgets { b.HBMBytes = hbm; return b }
	for _, tc := range []struct {
		name string
		s    Sizes
		want Budgets
		err  []string // substrings of the error; nil: no error
	}{
		{name: "host only", s: host, want: derived},
		{name: "no param in hbm ignores free hbm", s: with(host, func(s *Sizes) { s.HBMFreeBytes = -1 }), want: derived},
		{name: "hbm: all param shards fit", s: params, want: withHBM(derived, 8*k)},
		{name: "hbm: what is left", s: with(params, func(s *Sizes) { s.HBMFreeBytes = 5 * k }), want: withHBM(derived, 5*k)},
		{name: "hbm: override", s: with(params, func(s *Sizes) { s.HBMBytes = 50 * k }), want: withHBM(derived, 50*k)},
		{name: "hbm: override over what is left", s: with(params, func(s *Sizes) { s.HBMBytes = 101 * k }),
			err: []string{"hbm budget 404.0 KiB", "400.0 KiB left per device", "raise strata.hbm_bytes"}},
		{name: "hbm: less than two shards", s: with(params, func(s *Sizes) { s.HBMFreeBytes = 3 * k }),
			err: []string{"12.0 KiB of device memory", "at least two of the largest (16.0 KiB)", "raise strata.hbm_bytes"}},
		{name: "hbm: nothing left", s: with(params, func(s *Sizes) { s.HBMFreeBytes = -k }),
			err: []string{"0 B of device memory"}},
		{name: "hbm: saved inputs beyond the params", s: with(params, func(s *Sizes) { s.ActivationHBMBytes = 2 * k }), want: withHBM(derived, 10*k)},
		{name: "hbm: saved inputs only", s: with(host, func(s *Sizes) { s.HBMFreeBytes, s.ActivationHBMBytes = 3*k, 2*k }), want: withHBM(derived, 2*k)},
		{name: "hbm: the saved inputs' room first, the params what is left", s: with(params, func(s *Sizes) { s.HBMFreeBytes, s.ActivationHBMBytes = 9*k, 2*k }),
			want: withHBM(derived, 9*k)},
		{name: "hbm: no room for two param shards beside the saved inputs", s: with(params, func(s *Sizes) { s.HBMFreeBytes, s.ActivationHBMBytes = 5*k, 2*k }),
			err: []string{"12.0 KiB of device memory left for param shards", "at least two of the largest (16.0 KiB)"}},
		{name: "hbm: an override leaves no room for the saved inputs", s: with(params, func(s *Sizes) { s.HBMFreeBytes, s.HBMBytes, s.ActivationHBMBytes = 9*k, 8*k, 2*k }),
			err: []string{"4.0 KiB of device memory left beyond the params' room", "saved block inputs need 8.0 KiB", "raise strata.hbm_bytes"}},
		{name: "host budget", s: with(host, func(s *Sizes) { s.HostBudgetBytes = 50 * k }),
			want: Budgets{HostBytes: 40 * k, PlanHostBytes: 19 * k, PoolBytes: 50 * k}},
		{name: "host budget exactly enough", s: with(host, func(s *Sizes) { s.HostBudgetBytes = 35 * k }),
			want: Budgets{HostBytes: 28 * k, PlanHostBytes: 13 * k, PoolBytes: 35 * k}},
		{name: "host budget too small", s: with(host, func(s *Sizes) { s.HostBudgetBytes = 35*k - 1 }),
			err: []string{"strata.host_budget", "too small", "needs 112.0 KiB", "80.0 KiB homes", "24.0 KiB staging", "8.0 KiB spare", "raise it"}},
		{name: "static: homes only", s: with(host, func(s *Sizes) { s.Static = true }),
			want: Budgets{HostBytes: 26 * k, PlanHostBytes: 13 * k, PoolBytes: 26 * k}},
		{name: "static: homes past the 1 GiB arenas", s: with(host, func(s *Sizes) { s.Static = true; s.HomeBytes = 1 << 30 }),
			want: Budgets{HostBytes: 2<<30 + 6*k, PlanHostBytes: 1<<30 + 3*k, PoolBytes: 2<<30 + 6*k}},
		{name: "static: host budget pins only the homes", s: with(host, func(s *Sizes) { s.Static = true; s.HostBudgetBytes = 35 * k }),
			want: Budgets{HostBytes: 26 * k, PlanHostBytes: 13 * k, PoolBytes: 26 * k}},
		{name: "static: host budget exactly enough", s: with(host, func(s *Sizes) { s.Static = true; s.HostBudgetBytes = 26 * k }),
			want: Budgets{HostBytes: 26 * k, PlanHostBytes: 13 * k, PoolBytes: 26 * k}},
		{name: "static: host budget too small", s: with(host, func(s *Sizes) { s.Static = true; s.HostBudgetBytes = 26*k - 1 }),
			err: []string{"strata.host_budget", "too small", "takes 104.0 KiB (the homes, all ranks)", "raise it"}},
		{name: "static: host budget too small, optimizer on host", s: with(host, func(s *Sizes) { s.Static = true; s.OptimizerOnHost = true; s.HostBudgetBytes = 20 * k }),
			err: []string{"raise it, or put the optimizer state on NVMe"}},
		{name: "host budget too small, optimizer on host", s: with(host, func(s *Sizes) { s.HostBudgetBytes = 20 * k; s.OptimizerOnHost = true }),
			err: []string{"raise it, or put the optimizer state on NVMe"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PlanBudgets(tc.s)
			if tc.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				if got != tc.want {
					t.Errorf("got %+v, want %+v", got, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, budgets %+v", got)
			}
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if !tc.s.OptimizerOnHost && strings.Contains(err.Error(), "NVMe") {
				t.Errorf("error %q names NVMe with the optimizer state not on the host", err)
			}
		})
	}
}
