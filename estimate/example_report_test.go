package estimate_test

import (
	"fmt"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/model"
)

// ExampleFromConfig estimates a named shape at stage 3 on 4 devices with
// the optimizer state and the params on NVMe: one call from a resolved
// config.
func ExampleFromConfig() {
	shape, err := model.Lookup("gpt2")
	if err != nil {
		panic(err)
	}
	cfg := config.Default()
	cfg.Strata.Devices = 4
	cfg.ZeRO.Stage = 3
	cfg.ZeRO.OffloadOptimizer.Device = config.DeviceNVMe
	cfg.ZeRO.OffloadParam.Device = config.DeviceNVMe
	cfg.ZeRO.Stage3ParamPersistenceThreshold = 0
	cfg.ResolveModel(config.Shape(shape))
	rep, err := estimate.FromConfig(cfg, shape)
	if err != nil {
		panic(err)
	}
	js := rep.JSON()
	s := js.Stages[0]
	fmt.Printf("%s, stage %d on %d devices: %d parameters\n", js.Model, s.Stage, js.Devices, js.Params)
	fmt.Printf("per device %s; nvme all ranks %s\n", s.DeviceFormula, s.NVMeFormula)
	fmt.Println(s.NVMeBytes >= 12*js.Params, js.Master)
	// Output:
	// gpt2, stage 3 on 4 devices: 124439808 parameters
	// per device 0; nvme all ranks 12.12Ψ
	// true bf16+remainder
}
