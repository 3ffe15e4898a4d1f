package infer_test

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
)

const evalText = "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "

// TestEvaluateStreamedMatchesResident: the weights streamed from host RAM
// through an inference engine give the resident evaluation's loss in
// bf16 bit for bit on the CPU backend, over the same windows; the
// resident per-token losses average to the loss, and its logits rows are
// one per predicted token.
func TestEvaluateStreamedMatchesResident(t *testing.T) {
	dir, err := writeTinyModel(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat(evalText, 4)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const seq = 32

	m, err := infer.Open(ctx, dir, infer.Options{HBMBytes: 1 << 30, DType: "bf16"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Load(ctx, model.DecoderOptions{Capacity: seq}); err != nil {
		t.Fatal(err)
	}
	ts, err := infer.OpenTokenStream(text, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	var logits bytes.Buffer
	res, err := infer.Evaluate(ctx, m, infer.EvalInput{Text: ts}, infer.EvalOptions{Seq: seq, TokenLosses: true, Logits: &logits})
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(res.TokenLosses)) != res.Tokens || int64(logits.Len()) != res.Tokens*256*4 {
		t.Fatalf("%d tokens, %d per-token losses, %d bytes of logits", res.Tokens, len(res.TokenLosses), logits.Len())
	}
	var sum float64
	for _, l := range res.TokenLosses {
		sum += float64(l)
	}
	if mean := sum / float64(res.Tokens); math.Abs(mean-res.Loss) > 1e-4*res.Loss {
		t.Errorf("per-token losses average %v, the loss is %v", mean, res.Loss)
	}

	m, err = infer.Open(ctx, dir, infer.Options{HBMBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	src, err := data.Open(text, data.Options{Tokenizer: data.Bytes{}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	set, err := data.NewEvalSet(src, seq)
	if err != nil {
		t.Fatal(err)
	}
	str, err := infer.Evaluate(ctx, m, infer.EvalInput{Examples: set}, infer.EvalOptions{Offload: "cpu", Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if str.Loss != res.Loss || str.Tokens != res.Tokens || str.Windows != res.Windows || str.Params != "bf16" {
		t.Errorf("streamed: loss %v over %d tokens in %d windows (%s); resident %v over %d in %d (%s)",
			str.Loss, str.Tokens, str.Windows, str.Params, res.Loss, res.Tokens, res.Windows, res.Params)
	}
}

// TestEvaluateCancelled: a cancelled context stops an evaluation.
func TestEvaluateCancelled(t *testing.T) {
	dir, err := writeTinyModel(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := infer.Open(context.Background(), dir, infer.Options{HBMBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Load(context.Background(), model.DecoderOptions{Capacity: 16}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := infer.Evaluate(ctx, m, infer.EvalInput{Tokens: make([]int32, 100)}, infer.EvalOptions{Seq: 16}); err != context.Canceled {
		t.Errorf("Evaluate after cancel: %v, want context.Canceled", err)
	}
}
