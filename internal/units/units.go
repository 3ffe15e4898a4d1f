// Package units parses and prints byte sizes and the figures beside them.
//
// Binary suffixes (K, M, G, T and KiB, MiB, GiB, TiB) are powers of 1024,
// as fio and DeepSpeed read them; rates are printed in decimal MB/s
// (1 MB = 10^6 B), as the benchmarks say. Median and ErrWriter serve the
// tables that print them.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
	TiB int64 = 1 << 40
)

// ParseBytes reads "4096", "128K", "128KiB", "1M", "1.5G", "2GiB", "64KB".
// Every suffix is binary (K = 1024).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("units: empty byte size")
	}
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, suf := t[:i], strings.ToUpper(strings.TrimSpace(t[i:]))
	suf = strings.TrimSuffix(strings.TrimSuffix(suf, "IB"), "B")
	var mult int64
	switch suf {
	case "":
		mult = 1
	case "K":
		mult = KiB
	case "M":
		mult = MiB
	case "G":
		mult = GiB
	case "T":
		mult = TiB
	default:
		return 0, fmt.Errorf("units: byte size %q: unknown suffix (use K, M, G or T; binary)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("units: byte size %q is not a non-negative number", s)
	}
	v := f * float64(mult)
	if v > 1<<62 {
		return 0, fmt.Errorf("units: byte size %q is too large", s)
	}
	if v != float64(int64(v)) {
		return 0, fmt.Errorf("units: byte size %q is not a whole number of bytes", s)
	}
	return int64(v), nil
}

// FormatBytes prints n with a binary suffix: 1536 -> "1.5 KiB".
func FormatBytes(n int64) string {
	neg := n < 0
	u := n
	if neg {
		u = -n
	}
	var s string
	switch {
	case u >= TiB:
		s = fmt.Sprintf("%.2f TiB", float64(u)/float64(TiB))
	case u >= GiB:
		s = fmt.Sprintf("%.2f GiB", float64(u)/float64(GiB))
	case u >= MiB:
		s = fmt.Sprintf("%.1f MiB", float64(u)/float64(MiB))
	case u >= KiB:
		s = fmt.Sprintf("%.1f KiB", float64(u)/float64(KiB))
	default:
		s = fmt.Sprintf("%d B", u)
	}
	if neg {
		return "-" + s
	}
	return s
}

// FormatSize prints a block size the way fio writes it: 1048576 -> "1M",
// 131072 -> "128K", 4096 -> "4K", 1000 -> "1000".
func FormatSize(n int64) string {
	switch {
	case n >= GiB && n%GiB == 0:
		return fmt.Sprintf("%dG", n/GiB)
	case n >= MiB && n%MiB == 0:
		return fmt.Sprintf("%dM", n/MiB)
	case n >= KiB && n%KiB == 0:
		return fmt.Sprintf("%dK", n/KiB)
	}
	return strconv.FormatInt(n, 10)
}

// AlignUp rounds n up to a multiple of align (a power of two or any positive value).
func AlignUp(n, align int64) int64 {
	if align <= 0 {
		panic("units: AlignUp with non-positive alignment")
	}
	return (n + align - 1) / align * align
}

// Mul returns the product of its factors, and false when a factor is
// negative or the product does not fit in an int64. Every size that is a
// product of user-given counts (a model's parameters, their bytes) goes
// through it, so that a huge shape is refused rather than wrapped around.
func Mul(factors ...int64) (int64, bool) {
	p := int64(1)
	for _, f := range factors {
		if f < 0 {
			return 0, false
		}
		if f != 0 && p > math.MaxInt64/f {
			return 0, false
		}
		p *= f
	}
	return p, true
}

// Add returns the sum of its non-negative terms, and false when a term is
// negative or the sum does not fit in an int64.
func Add(terms ...int64) (int64, bool) {
	s := int64(0)
	for _, t := range terms {
		if t < 0 || s > math.MaxInt64-t {
			return 0, false
		}
		s += t
	}
	return s, true
}
