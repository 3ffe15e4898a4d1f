package main

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"testing"
)

// TestTrain runs the program: the byte model learns the sentence (from
// ln 256 ≈ 5.55 nats to under 1).
func TestTrain(t *testing.T) {
	var out bytes.Buffer
	if err := train(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "byte-mlp: 21824 parameters in 3 chunks, ZeRO stage 3 on 2 devices") {
		t.Fatalf("output:\n%s", out.String())
	}
	loss := func(line string) float64 {
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return v
	}
	if first, last := loss(lines[1]), loss(lines[5]); math.Abs(first-math.Log(256)) > 0.1 || last > 1 {
		t.Errorf("loss %v -> %v, want about ln 256 -> under 1:\n%s", first, last, out.String())
	}
}
