package engine_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// exampleConfig: the named decoder "tiny" (GPT-2 over bytes) at ZeRO
// stage 3 on 2 devices, its optimizer state in host RAM (ZeRO-Offload).
const exampleConfig = `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-2, "weight_decay": 0}},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "steps": 60, "seed": 1}
}`

// Example trains a built-in decoder on a repeated sentence with ZeRO
// stage 3 on two CPU devices and CPU Adam. A model of your own goes in
// engine.Options.Model instead (examples/bytemlp, examples/gomodel).
func Example() {
	cfg, err := config.Parse([]byte(exampleConfig), "example.json", config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		log.Fatal(err)
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: cfg.Strata.Devices, HBMBytes: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	text := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 100)
	e, err := engine.New(cfg, cpu.Devices(devs), comms, engine.Options{Corpus: model.Tokens(model.Encode([]byte(text)))})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	var losses []float64
	err = e.Run(context.Background(), cfg.Strata.Steps, func(st report.StepStats) error {
		losses = append(losses, st.Loss)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d parameters in %d chunks, %d steps at stage %d\n", e.Layout().Name, e.Layout().ParamCount(), len(e.Layout().Chunks), e.StepCount(), cfg.ZeRO.Stage)
	fmt.Printf("the loss fell by more than half: %v\n", losses[len(losses)-1] < losses[0]/2)
	// Output:
	// tiny: 35712 parameters in 4 chunks, 60 steps at stage 3
	// the loss fell by more than half: true
}
