package infer_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
)

// forceToken makes every position's most likely next token id: the final
// norm's gain 0 and bias 1 make every hidden state all ones, and the tied
// head's row of id all ones gives id the logit Dim, far above the others
// (the rows are N(0, 0.01)).
func forceToken(id int) func(*model.Layout, [][]float32) {
	return func(l *model.Layout, chunks [][]float32) {
		last := len(l.Chunks) - 1
		g, b := l.Chunks[last].Tensors[0], l.Chunks[last].Tensors[1]
		for i := range g.Len {
			chunks[last][g.Offset+i], chunks[last][b.Offset+i] = 0, 1
		}
		wte := l.Chunks[0].Tensors[0]
		dim := wte.Shape[1]
		for i := range dim {
			chunks[0][wte.Offset+id*dim+i] = 1
		}
	}
}

// setConfig sets key of dir's config.json to v.
func setConfig(t *testing.T, dir, key string, v any) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg[key] = v
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestGenerateStopsAtConfigEOS: a model whose config.json names EOS ids
// the tokenizer does not (the byte tokenizer names none) stops at them,
// one id or a list, and says so; without eos_token_id it runs on to
// MaxNewTokens.
func TestGenerateStopsAtConfigEOS(t *testing.T) {
	for _, c := range []struct {
		name string
		eos  any
		want []int32
	}{{"one", 200, []int32{200}}, {"list", []int{7, 200}, []int32{7, 200}}, {"none", nil, nil}} {
		t.Run(c.name, func(t *testing.T) {
			dir, err := writeTinyModel(t.TempDir(), forceToken(200))
			if err != nil {
				t.Fatal(err)
			}
			if c.eos != nil {
				setConfig(t, dir, "eos_token_id", c.eos)
			}
			ctx := context.Background()
			m, err := infer.Open(ctx, dir, infer.Options{HBMBytes: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if _, ok := m.Tokenizer.EOS(); ok {
				t.Fatal("the byte tokenizer names an EOS")
			}
			if got := m.EOS(); !slices.Equal(got, c.want) {
				t.Errorf("EOS ids %v, want %v", got, c.want)
			}
			if err := m.Load(ctx, model.DecoderOptions{Capacity: 16}); err != nil {
				t.Fatal(err)
			}
			prompt := m.Tokenizer.Encode("hi", false)
			var got []int32
			r, err := infer.Generate(ctx, m, prompt, infer.GenOptions{MaxNewTokens: 4}, func(tok infer.Token) error {
				if !tok.Final {
					got = append(got, tok.ID)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if c.eos == nil {
				if r.Stop != infer.StopMaxTokens || !slices.Equal(got, []int32{200, 200, 200, 200}) {
					t.Errorf("without eos_token_id: generated %v, stopped at %s; want four 200s and max new tokens", got, r.Stop)
				}
				return
			}
			if r.Stop != infer.StopEOS || r.StopID != 200 || r.Generated != 0 || len(got) != 0 {
				t.Errorf("generated %v (%d), stopped at %s id %d; want nothing, stopped at EOS id 200", got, r.Generated, r.Stop, r.StopID)
			}
		})
	}
}
