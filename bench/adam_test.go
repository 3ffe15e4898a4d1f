package bench

import (
	"testing"

	"github.com/strata-ai/strata/cpuadam"
)

func TestRunAdamSmall(t *testing.T) {
	for _, o := range []AdamOptions{
		{Params: 10_000, Rounds: 3, Roofline: true},
		{Params: 999, Rounds: 2, GradBF16: true, BF16Out: true, Threads: 2, ISA: cpuadam.ISAGo},
	} {
		res, err := RunAdam(o)
		if err != nil {
			t.Fatal(err)
		}
		want := 28
		if o.GradBF16 {
			want = 26 + 2
		}
		if res.BytesPerParam != want || res.Params != o.Params || res.Rounds != o.Rounds {
			t.Fatalf("%+v: result %+v", o, res)
		}
		if !(res.GBps > 0 && res.ParamsPerS > 0) || (o.Roofline && !(res.RooflineGBps > 0 && res.Ratio > 0)) || (!o.Roofline && res.RooflineGBps != 0) {
			t.Fatalf("%+v: figures missing: %+v", o, res)
		}
	}
	if _, err := RunAdam(AdamOptions{Params: -1}); err == nil {
		t.Fatal("negative params accepted")
	}
}
