package engine

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// TestInferenceEval: an inference engine (every chunk frozen) evaluates
// the rows a training engine evaluates to the same bits, with the params
// on the devices, in host RAM and on NVMe (with or without the optimizer
// offload a training engine needs), and refuses to step.
func TestInferenceEval(t *testing.T) {
	ref := newEngineJSON(t, freezeSpec{stage: 0, n: 1, opt: "none", param: "none"}.configJSON(t), 1)
	set := heldOutSet(t)
	want, err := ref.Eval(t.Context(), set)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []freezeSpec{
		{stage: 0, n: 1, opt: "none", param: "none"},
		{stage: 3, n: 1, opt: "cpu", param: "cpu"},
		{stage: 3, n: 1, opt: "nvme", param: "nvme"},
		{stage: 3, n: 2, opt: "nvme", param: "nvme"},
		// An inference engine has no optimizer to offload: params on NVMe
		// or in host RAM need no offload_optimizer.
		{stage: 3, n: 1, opt: "none", param: "nvme"},
		{stage: 3, n: 1, opt: "none", param: "cpu"},
	} {
		t.Run(s.String(), func(t *testing.T) {
			devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
			if err != nil {
				t.Fatal(err)
			}
			js := s.configJSON(t)
			if s.opt == "none" && s.param == "nvme" {
				nvme := s
				nvme.opt = "nvme"
				js = strings.Replace(nvme.configJSON(t), `"offload_optimizer": {"device": "nvme"`, `"offload_optimizer": {"device": "none"`, 1)
			}
			e, err := startEngine(t, testConfig(t, js), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Inference: true})
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Eval(t.Context(), set)
			if err != nil {
				t.Fatal(err)
			}
			if got.Loss != want.Loss || got.Tokens != want.Tokens {
				t.Errorf("loss %v over %d tokens, the training engine's %v over %d", got.Loss, got.Tokens, want.Loss, want.Tokens)
			}
			if _, err := e.Step(); err == nil || !strings.Contains(err.Error(), "Step of an inference engine") {
				t.Errorf("Step: %v", err)
			}
		})
	}
}
