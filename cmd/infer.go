package cmd

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/urfave/cli/v2"
)

// What eval and generate share: the model of --model (a Hugging Face
// directory, a Strata run directory or checkpoint, opened as train --init
// opens one) opened by infer.Open, loaded resident on one device, chunk by
// chunk, with its tokenizer, and a model.Decoder sized for the command.

// inferFlags are the flags eval and generate share.
func inferFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "model", Required: true, Usage: "a Hugging Face model directory, or a Strata run directory or checkpoint (as train --init and --resume name one)"},
		&cli.StringFlag{Name: "backend", Value: "cpu", Usage: "device backend: cpu, or cuda (one GPU)"},
		&cli.StringFlag{Name: "hbm", Usage: "the device's memory budget (default: cpu 8GiB, cuda the GPU's free memory)"},
		&cli.StringFlag{Name: "dtype", Value: "auto", Usage: "parameter dtype on the device: auto (fp32 for weights stored in F32 or F16, bf16 for weights stored in BF16), fp32 or bf16"},
	}
}

// openInference checks the shared flags and opens the model of c's
// --model for cmd ("eval", "generate"): its weights, parameter dtype,
// tokenizer and one device of --backend (infer.Open).
func openInference(c *cli.Context, cmd string) (*infer.Model, error) {
	name := c.String("backend")
	if !slices.Contains(backend.Names, name) {
		return nil, usagef("%s: --backend %q is not one of %s", cmd, name, strings.Join(backend.Names, ", "))
	}
	var hbm int64
	if v := c.String("hbm"); v != "" {
		var err error
		if hbm, err = units.ParseBytes(v); err != nil || hbm == 0 {
			return nil, usagef("%s: --hbm %q: want a byte size such as 16GiB (%v)", cmd, v, err)
		}
		if name == "cpu" {
			if err := cpu.CheckHostRAM(1, hbm); err != nil {
				return nil, fmt.Errorf("%s: %w", cmd, err)
			}
		}
	}
	dtFlag := c.String("dtype")
	if dtFlag != "auto" && dtFlag != "fp32" && dtFlag != "bf16" {
		return nil, usagef("%s: --dtype %q: want auto, fp32 or bf16", cmd, dtFlag)
	}
	o := infer.Options{Backend: name, HBMBytes: hbm, DType: dtFlag, Name: cmd}
	if cmd == "generate" { // a mixture of experts' experts off the device
		o.Experts, o.NVMePath, o.ExpertCache, o.ExpertPolicy = c.String("experts"), c.String("nvme-path"), c.Int("expert-cache"), c.String("expert-policy")
		if err := o.Validate(); err != nil {
			return nil, usagef("%s: %v", cmd, err)
		}
		if o.Experts == infer.ExpertsNVMe && o.NVMePath == "" {
			return nil, usagef("%s: --experts nvme needs --nvme-path DIR", cmd)
		}
	}
	return infer.Open(c.Context, c.String("model"), o)
}

// loadInference refuses a model whose parameters and decoder (opts) do not
// fit the device's memory, then loads the weights a chunk at a time and
// says so on stderr.
func loadInference(c *cli.Context, m *infer.Model, opts model.DecoderOptions, stderr io.Writer) error {
	if err := m.CheckFits(opts); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "model: %s\n", m.Source.Describe())
	fmt.Fprintf(stderr, "params %s (%s), activations and key/value cache fp32; tokenizer %s; %s\n", m.DType, m.DTypeWhy, m.TokenizerFrom, m.Devices.Describe)
	start := time.Now()
	if err := m.Load(c.Context, opts); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "loaded %s parameters in %.1fs; %s holds them (%s) and %s of activations and key/value cache for %d tokens\n",
		infer.FormatCount(m.Layout.ParamCount()), time.Since(start).Seconds(), m.Device.Name(), units.FormatBytes(m.WeightsBytes()),
		units.FormatBytes(model.DecoderBytes(m.Shape(), opts)), opts.Capacity)
	return nil
}
