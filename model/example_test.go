package model_test

import (
	"bytes"
	"fmt"

	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// Example trains the named shape "tiny" (a 2-layer GPT-2) for a few steps
// with the plain single-device loop, on a CPU device, from text encoded
// one token per byte.
func Example() {
	shape, err := model.Lookup("tiny")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(shape.Layers, "layers,", shape.ParamCount(), "params")

	text := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog. "), 20)
	data, err := model.NewSampler(model.Encode(text), 32, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 256 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	opts := model.TrainOptions{Batch: 4, Seq: 32, LR: 1e-2, Seed: 1}
	losses, err := model.Train(devs[0], shape, data, opts, 20)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The first loss is near ln(256) ≈ 5.55: a uniform guess over the bytes.
	fmt.Printf("%d steps; first loss %.1f; loss fell: %v\n", len(losses), losses[0], losses[len(losses)-1] < losses[0])
	// Output:
	// 2 layers, 35712 params
	// 20 steps; first loss 5.6; loss fell: true
}
