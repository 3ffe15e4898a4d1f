package lossscale

import (
	"errors"
	"strings"
	"testing"
)

// run feeds verdicts (true: overflow) and returns the scale of each step
// (the scale it ran with) and the first error.
func run(c Config, verdicts []bool) ([]float64, error) {
	s := New(c)
	var out []float64
	for _, v := range verdicts {
		out = append(out, s.Scale())
		if err := s.Update(v); err != nil {
			return out, err
		}
	}
	return out, nil
}

func same(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRules: sequences worked out by hand from DeepSpeed's update_scale.
func TestRules(t *testing.T) {
	F, T := false, true
	cases := []struct {
		name     string
		cfg      Config
		verdicts []bool
		want     []float64
	}{
		// Window 2 from iteration 0 with last_overflow -1: the doubling
		// comes after the 2nd good step (iteration 1: (1+1)%2 == 0).
		{"doubles every window", Config{InitialPower: 1, Window: 2, Hysteresis: 2, MinScale: 1}, []bool{F, F, F, F, F}, []float64{2, 2, 4, 4, 8}},
		// hysteresis 3: two overflows spend it, the third halves; no good
		// step refills it before the window (no consecutive).
		{"hysteresis 3", Config{InitialPower: 6, Window: 100, Hysteresis: 3, MinScale: 1}, []bool{T, F, T, T, T}, []float64{64, 64, 64, 64, 32}},
		// consecutive: a good step refills it, so alternating overflows
		// never halve.
		{"consecutive", Config{InitialPower: 6, Window: 100, Hysteresis: 2, ConsecutiveHysteresis: true, MinScale: 1}, []bool{T, F, T, F, T, T, F}, []float64{64, 64, 64, 64, 64, 64, 32}},
		// The window counts from the last overflow: 3 good steps after
		// the overflow at iteration 0 double at iteration 3.
		{"window from the overflow", Config{InitialPower: 4, Window: 3, Hysteresis: 1, MinScale: 1}, []bool{T, F, F, F, F}, []float64{16, 8, 8, 8, 16}},
		// Halving stops at the minimum (max(scale/2, min)), not below.
		{"clamped at min", Config{InitialPower: 3, Window: 100, Hysteresis: 1, MinScale: 3}, []bool{T, T}, []float64{8, 4}},
		{"static", Config{Static: 128, InitialPower: 16, Window: 1, Hysteresis: 1, MinScale: 1}, []bool{T, F, T, F}, []float64{128, 128, 128, 128}},
	}
	for _, c := range cases {
		got, err := run(c.cfg, c.verdicts)
		if err != nil || !same(got, c.want) {
			t.Errorf("%s: scales %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

// TestMinScale: an overflow while the scale is min_loss_scale is
// ErrMinScale, and leaves the state as it was.
func TestMinScale(t *testing.T) {
	s := New(Config{InitialPower: 3, Window: 100, Hysteresis: 1, MinScale: 4})
	if err := s.Update(true); err != nil || s.Scale() != 4 {
		t.Fatalf("8 -> %g, %v; want 4", s.Scale(), err)
	}
	before := s.State()
	if err := s.Update(true); !errors.Is(err, ErrMinScale) {
		t.Fatalf("overflow at the minimum: %v, want ErrMinScale", err)
	}
	if s.State() != before {
		t.Fatalf("state %+v after the error, was %+v", s.State(), before)
	}
}

// TestDefaults are DeepSpeed's (precision_config.py).
func TestDefaults(t *testing.T) {
	d := Defaults()
	if d != (Config{InitialPower: 16, Window: 1000, Hysteresis: 2, MinScale: 1}) || New(d).Scale() != 65536 {
		t.Fatalf("defaults %+v", d)
	}
	if err := (Config{Window: 1, Hysteresis: 0, MinScale: 1}).Validate(); err == nil {
		t.Fatal("hysteresis 0 accepted")
	}
}

// TestValidateBounds: a static scale outside [2^-100, 2^100] and a
// min_loss_scale above the dynamic scale's start are refused naming the
// key; min_loss_scale does not bound a static scale.
func TestValidateBounds(t *testing.T) {
	d := Defaults()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Static: 1e38, MinScale: 1}, "fp16.loss_scale 1e+38"},
		{Config{Static: 1e-31, MinScale: 1}, "fp16.loss_scale 1e-31"},
		{Config{InitialPower: 4, Window: 1, Hysteresis: 1, MinScale: 32}, "fp16.min_loss_scale 32: above the initial scale 2^4"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.cfg, err, c.want)
		}
	}
	for _, ok := range []Config{d, {Static: 0.5, MinScale: 1}, {Static: 1e-30, MinScale: 1}, {InitialPower: 4, Window: 1, Hysteresis: 1, MinScale: 16}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
}
