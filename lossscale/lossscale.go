package lossscale

import (
	"errors"
	"fmt"
	"math"
)

// Config is the fp16 block's scaling keys.
type Config struct {
	// Static is loss_scale: 0 for dynamic scaling, else the fixed scale.
	Static float64
	// InitialPower is initial_scale_power: the dynamic scale starts at
	// 2^InitialPower (DeepSpeed: 16).
	InitialPower int
	// Window is loss_scale_window: good steps before the scale doubles
	// (1000).
	Window int
	// Hysteresis is hysteresis, DeepSpeed's delayed_shift: overflows
	// tolerated before the scale halves (2).
	Hysteresis int
	// ConsecutiveHysteresis is consecutive_hysteresis: every good step
	// refills the hysteresis (false).
	ConsecutiveHysteresis bool
	// MinScale is min_loss_scale (1).
	MinScale float64
}

// Defaults is DeepSpeed's fp16 block with only "enabled": true.
func Defaults() Config {
	return Config{InitialPower: 16, Window: 1000, Hysteresis: 2, MinScale: 1}
}

// Validate says what is wrong with c.
func (c Config) Validate() error {
	switch {
	case !(c.Static >= 0):
		return fmt.Errorf("fp16.loss_scale %v: want 0 (dynamic) or a positive scale", c.Static)
	case c.Static > 0 && (c.Static < MinStatic || c.Static > MaxStatic):
		return fmt.Errorf("fp16.loss_scale %g: want 0 (dynamic) or a static scale from 2^-100 to 2^100 (outside it fp16 holds no real gradient)", c.Static)
	case c.Static > 0:
		return nil // min_loss_scale does not apply to a static scale
	case c.InitialPower < 0 || c.InitialPower > 100:
		return fmt.Errorf("fp16.initial_scale_power %d: want 0 to 100", c.InitialPower)
	case c.Window < 1:
		return fmt.Errorf("fp16.loss_scale_window %d: want at least 1", c.Window)
	case c.Hysteresis < 1:
		return fmt.Errorf("fp16.hysteresis %d: want at least 1", c.Hysteresis)
	case !(c.MinScale > 0):
		return fmt.Errorf("fp16.min_loss_scale %v: want a positive scale", c.MinScale)
	case c.MinScale > math.Ldexp(1, c.InitialPower):
		return fmt.Errorf("fp16.min_loss_scale %g: above the initial scale 2^%d (initial_scale_power): the scale only halves down to it", c.MinScale, c.InitialPower)
	}
	return nil
}

// MinStatic and MaxStatic bound a static scale, as initial_scale_power's
// 0 to 100 bounds the dynamic one's start: above 2^100 every gradient over
// 65504·2^-100 overflows fp16, below 2^-100 every one under 2^-24·2^100
// flushes to zero.
var (
	MinStatic = math.Ldexp(1, -100)
	MaxStatic = math.Ldexp(1, 100)
)

// State is a scaler's whole state: what a checkpoint keeps.
type State struct {
	Scale         float64 `json:"scale"`
	Iter          int64   `json:"iter"`               // DeepSpeed's cur_iter: Update calls so far
	LastOverflow  int64   `json:"last_overflow_iter"` // -1: none yet
	CurHysteresis int     `json:"cur_hysteresis"`
}

// Scaler applies Config's rules.
type Scaler struct {
	cfg Config
	st  State
}

// ErrMinScale is the overflow of a step already at the smallest scale.
var ErrMinScale = errors.New("loss scale already at min_loss_scale")

// New is a scaler at its initial state.
func New(c Config) *Scaler {
	s := &Scaler{cfg: c, st: State{Scale: c.Static, LastOverflow: -1, CurHysteresis: c.Hysteresis}}
	if c.Static == 0 {
		s.st.Scale = math.Ldexp(1, c.InitialPower)
	}
	return s
}

// Dynamic says whether the scale moves.
func (s *Scaler) Dynamic() bool { return s.cfg.Static == 0 }

// Scale is the scale the next step runs with.
func (s *Scaler) Scale() float64 { return s.st.Scale }

// State is the scaler's state, for a checkpoint.
func (s *Scaler) State() State { return s.st }

// Restore replaces the state (a resumed checkpoint's).
func (s *Scaler) Restore(st State) { s.st = st }

// Update records one step's verdict and sets the next step's scale. An
// overflow at MinScale returns ErrMinScale and leaves the state as it was.
// A static scaler only counts the steps and remembers the last overflow.
func (s *Scaler) Update(overflow bool) error {
	c, st := s.cfg, &s.st
	if !s.Dynamic() {
		if overflow {
			st.LastOverflow = st.Iter
		}
		st.Iter++
		return nil
	}
	if overflow {
		if c.Hysteresis == 1 || st.CurHysteresis == 1 {
			if st.Scale == c.MinScale {
				return fmt.Errorf("%w (%g)", ErrMinScale, c.MinScale)
			}
			st.Scale = max(st.Scale/2, c.MinScale)
		} else {
			st.CurHysteresis--
		}
		st.LastOverflow = st.Iter
	} else {
		if c.ConsecutiveHysteresis {
			st.CurHysteresis = c.Hysteresis
		}
		if (st.Iter-st.LastOverflow)%int64(c.Window) == 0 {
			if !c.ConsecutiveHysteresis {
				st.CurHysteresis = c.Hysteresis
			}
			st.Scale *= 2
		}
	}
	st.Iter++
	return nil
}
