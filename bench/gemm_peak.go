package bench

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/cpu"
)

// CPUPeak is the machine's fp32 peak for the cores a benchmark uses:
// Cores × FMAUnits × LanesF32 × 2 flops × GHz.
type CPUPeak struct {
	Cores       int     `json:"cores"`
	MHz         float64 `json:"mhz"`
	ClockSource string  `json:"clock_source"`
	ISA         string  `json:"isa"`
	FMAUnits    int     `json:"fma_units"`
	LanesF32    int     `json:"lanes_f32"`
	GFLOPS      float64 `json:"gflops"`
	Assumption  string  `json:"assumption"`
}

func (p CPUPeak) String() string {
	return fmt.Sprintf("%d cores × %d FMA units × %d fp32 lanes (%s) × 2 flops × %.0f MHz (%s) = %.1f GFLOP/s [%s]",
		p.Cores, p.FMAUnits, p.LanesF32, p.ISA, p.MHz, p.ClockSource, p.GFLOPS, p.Assumption)
}

// DetectCPUPeak computes the peak for min(workers, NumCPU) cores. The clock
// is the maximum frequency of cpufreq when the kernel exposes it, else the
// "cpu MHz" of /proc/cpuinfo. The FMA width comes from the CPU's features;
// the number of FMA units per core is not visible to software and is
// assumed: 2 (server cores since Skylake-SP with AVX-512, and every AVX2
// core since Haswell). On a part with one 512-bit FMA unit the true peak
// is half.
func DetectCPUPeak(workers int) CPUPeak {
	p := CPUPeak{Cores: min(max(1, workers), runtime.NumCPU())}
	switch {
	case cpu.X86.HasAVX512F:
		p.ISA, p.LanesF32, p.FMAUnits = "avx512", 16, 2
		p.Assumption = "2 AVX-512 FMA units per core"
	case cpu.X86.HasAVX2 && cpu.X86.HasFMA:
		p.ISA, p.LanesF32, p.FMAUnits = "avx2+fma", 8, 2
		p.Assumption = "2 AVX2 FMA units per core"
	case cpu.ARM64.HasASIMD:
		p.ISA, p.LanesF32, p.FMAUnits = "neon", 4, 2
		p.Assumption = "2 NEON FMA pipes per core"
	default:
		p.ISA, p.LanesF32, p.FMAUnits = "scalar", 1, 1
		p.Assumption = "1 scalar FMA per core-cycle"
	}
	p.MHz, p.ClockSource = cpuClockMHz()
	p.GFLOPS = float64(p.Cores*p.FMAUnits*p.LanesF32*2) * p.MHz / 1e3
	return p
}

func cpuClockMHz() (float64, string) {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); err == nil {
		if khz, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil && khz > 0 {
			return khz / 1e3, "cpufreq cpuinfo_max_freq"
		}
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0, "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 0 {
				return mhz, "/proc/cpuinfo cpu MHz"
			}
		}
	}
	return 0, "unknown"
}
