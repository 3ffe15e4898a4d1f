package engine

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// TestBuiltinAccessOrders: the access orders of package model's decoders
// (tied and untied heads) and model.StackOrder keep the rules of
// Model.AccessOrder that the engine checks for every model.
func TestBuiltinAccessOrders(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-llama", "tiny-qwen2"} {
		s, err := model.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, tied := range []bool{false, true} {
			s.TieEmbeddings = tied
			if err := model.CheckAccessOrder(model.AccessOrder(s), s.Layers+2); err != nil {
				t.Errorf("%s tied=%v: %v", name, tied, err)
			}
		}
	}
	for n := 1; n <= 4; n++ {
		if err := model.CheckAccessOrder(model.StackOrder(n), n); err != nil {
			t.Errorf("StackOrder(%d): %v", n, err)
		}
	}
}

// TestAccessOrderRules: each rule of Model.AccessOrder, broken once.
func TestAccessOrderRules(t *testing.T) {
	acq := func(c int, p shard.Phase) model.Access {
		return model.Access{Kind: model.AccessAcquire, Chunk: c, Pass: p}
	}
	rel := func(c int, p shard.Phase) model.Access {
		return model.Access{Kind: model.AccessRelease, Chunk: c, Pass: p}
	}
	grad := func(c int) model.Access {
		return model.Access{Kind: model.AccessGrad, Chunk: c, Pass: shard.Backward}
	}
	ready := func(c int) model.Access {
		return model.Access{Kind: model.AccessGradReady, Chunk: c, Pass: shard.Backward}
	}
	fw, bw := shard.Forward, shard.Backward
	fwd := []model.Access{acq(0, fw), rel(0, fw), acq(1, fw), rel(1, fw), acq(2, fw), rel(2, fw)}
	cases := []struct {
		name  string
		order []model.Access
		want  string
	}{
		{"three gradients open", append(fwd[:6:6], grad(2), grad(1), grad(0), ready(2), ready(1), ready(0)), "three gradients open at once"},
		{"grad twice", append(fwd[:6:6], grad(2), ready(2), grad(2), grad(1), ready(1), grad(0), ready(0)), "chunk 2's gradient is asked for twice"},
		{"ready without grad", append(fwd[:6:6], ready(2), grad(1), ready(1), grad(0), ready(0)), "GradReady of chunk 2 needs one Grad before it"},
		{"grad in the forward", []model.Access{acq(0, fw), rel(0, fw), {Kind: model.AccessGrad, Chunk: 0, Pass: fw}}, "gradients are handed out in the backward only"},
		{"release of another chunk", []model.Access{acq(0, fw), rel(1, fw)}, "not the chunk and pass of the Acquire before it"},
		{"release of another pass", append(fwd[:6:6], acq(2, bw), rel(2, fw)), "a forward call after the backward began"},
		{"never released", append(fwd[:6:6], acq(2, bw), grad(2), ready(2), grad(1), ready(1), grad(0), ready(0)), "chunk 2 is never released"},
		{"unknown kind", []model.Access{{Kind: 9}}, "unknown kind 9"},
		{"unknown pass", []model.Access{{Kind: model.AccessAcquire, Pass: 7}}, "neither forward nor backward"},
	}
	for _, tc := range cases {
		err := model.CheckAccessOrder(tc.order, 3)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
