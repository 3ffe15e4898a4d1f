package units

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

func TestParseBytes(t *testing.T) {
	good := map[string]int64{"4096": 4096, "128K": 128 << 10, "128KiB": 128 << 10, "64KB": 64 << 10,
		"1M": 1 << 20, "1.5G": 3 << 29, "2GiB": 2 << 30, "1t": 1 << 40, " 8m ": 8 << 20}
	for in, want := range good {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "K", "12Q", "-1", "0.3", "1e30G"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) succeeded", bad)
		}
	}
}

func TestFormat(t *testing.T) {
	if s := FormatSize(1 << 20); s != "1M" {
		t.Error(s)
	}
	if s := FormatSize(128 << 10); s != "128K" {
		t.Error(s)
	}
	if s := FormatBytes(1536); s != "1.5 KiB" {
		t.Error(s)
	}
	if AlignUp(4097, 4096) != 8192 || AlignUp(0, 512) != 0 {
		t.Error("AlignUp")
	}
}

func TestMulAdd(t *testing.T) {
	for _, c := range []struct {
		f    []int64
		want int64
		ok   bool
	}{
		{nil, 1, true}, {[]int64{3, 4}, 12, true}, {[]int64{0, math.MaxInt64, 2}, 0, true},
		{[]int64{1 << 32, 1 << 31}, 0, false}, {[]int64{math.MaxInt64, 1}, math.MaxInt64, true},
		{[]int64{-1, 2}, 0, false}, {[]int64{1_000_000, 1_000_000, 12_000_000}, 0, false},
	} {
		got, ok := Mul(c.f...)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("Mul(%v) = %d, %v; want %d, %v", c.f, got, ok, c.want, c.ok)
		}
	}
	if s, ok := Add(math.MaxInt64-1, 1); !ok || s != math.MaxInt64 {
		t.Errorf("Add at the edge: %d %v", s, ok)
	}
	if _, ok := Add(math.MaxInt64, 1); ok {
		t.Error("Add overflow not detected")
	}
	if _, ok := Add(-1); ok {
		t.Error("Add of a negative term not refused")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		v := slices.Clone(c.v)
		if got := Median(v); got != c.want || !slices.Equal(v, c.v) {
			t.Errorf("Median(%v) = %v (input now %v), want %v", c.v, got, v, c.want)
		}
	}
}

func TestErrWriter(t *testing.T) {
	bad := errors.New("disk full")
	n := 0
	w := &ErrWriter{W: writerFunc(func(p []byte) (int, error) { n++; return 0, bad })}
	fmt.Fprintf(w, "a")
	fmt.Fprintf(w, "b")
	if w.Err != bad || n != 1 {
		t.Errorf("err %v after %d writes, want %v after 1", w.Err, n, bad)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
