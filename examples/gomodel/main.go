// Command gomodel trains a model defined in Go with ZeRO stage 3.
//
// The model is package bytemlp's (a byte-level language model with a
// hidden layer), on two CPU devices, its parameters and optimizer state
// sharded across them.
//
//	go run ./examples/gomodel
//
// On a GPU box, open the devices with gpu/backend ("cuda") instead of
// gpu/cpu; nothing else changes.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/examples/bytemlp"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// trainConfig: ZeRO stage 3 on 2 devices, every chunk sharded (no
// persistence threshold), 40 steps of AdamW. No strata.model: the model
// comes from engine.Options.Model.
const trainConfig = `{
  "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-2, "weight_decay": 0}},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
  "strata": {"devices": 2, "seq_len": 32, "steps": 40, "seed": 1}
}`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := train(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// train trains the model on a repeated sentence and prints the loss every
// ten steps; Ctrl-C (ctx) stops it between steps.
func train(ctx context.Context, w io.Writer) error {
	m, err := bytemlp.New(16, 64)
	if err != nil {
		return err
	}
	cfg, err := config.Parse([]byte(trainConfig), "gomodel.json", config.Options{})
	if err != nil {
		return err
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: cfg.Strata.Devices, HBMBytes: 64 << 20})
	if err != nil {
		return err
	}
	text := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 200)
	e, err := engine.New(cfg, cpu.Devices(devs), comms, engine.Options{Model: m, Corpus: model.Tokens(model.Encode([]byte(text)))})
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Fprintf(w, "%s: %d parameters in %d chunks, ZeRO stage %d on %d devices\n",
		e.Layout().Name, e.Layout().ParamCount(), len(e.Layout().Chunks), cfg.ZeRO.Stage, len(devs))
	return e.Run(ctx, cfg.Strata.Steps, func(st report.StepStats) error {
		if st.Step == 1 || st.Step%10 == 0 {
			fmt.Fprintf(w, "step %2d  loss %.3f\n", st.Step, st.Loss)
		}
		return nil
	})
}
