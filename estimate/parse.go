package estimate

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/config"
)

// The written forms a request's parts take on a command line.

// ParseParamCount reads "124M", "1.5B", "7.5e9", "350000" (decimal suffixes
// K, M, B or G, T, as parameter counts are written).
func ParseParamCount(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	if n := len(t); n > 0 {
		switch strings.ToUpper(t[n-1:]) {
		case "K":
			mult = 1e3
		case "M":
			mult = 1e6
		case "B", "G":
			mult = 1e9
		case "T":
			mult = 1e12
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a positive parameter count (such as 124M, 1.5B or 7.5e9)", s)
	}
	v := math.Round(f * mult)
	if v < 1 || v > 1e15 {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return int64(v), nil
}

// ParseLoRA reads strata.lora written on one line: "r=16", with
// ",alpha=32", ",targets=q_proj+v_proj" (or all-linear), ",rslora" and
// ",base=nf4" (or int8, bf16); PEFT's defaults (r 8, alpha 8) for what it
// leaves out. The targets default as strata.lora's (LoRAFromConfig).
func ParseLoRA(spec string) (*config.LoRA, error) {
	lc := &config.LoRA{R: 8, Alpha: 8} // PEFT's defaults, as strata.lora
	for _, kv := range strings.Split(spec, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		var err error
		switch k {
		case "r":
			lc.R, err = strconv.Atoi(v)
		case "alpha":
			lc.Alpha, err = strconv.ParseFloat(v, 64)
		case "targets":
			lc.TargetModules = strings.Split(v, "+")
		case "rslora":
			lc.UseRSLoRA = true
		case "base":
			if v != config.BaseBF16 && v != config.BaseNF4 && v != config.BaseInt8 {
				return nil, fmt.Errorf("base=%q is not bf16, nf4 or int8", v)
			}
			lc.BaseDType = v
		default:
			return nil, fmt.Errorf("%q is not r, alpha, targets, rslora or base", kv)
		}
		if err != nil {
			return nil, fmt.Errorf("%s=%q is not a number", k, v)
		}
	}
	if lc.R < 1 || !(lc.Alpha > 0) {
		return nil, fmt.Errorf("r must be >= 1 and alpha > 0")
	}
	return lc, nil
}
