package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/source"
)

// Open a Hugging Face directory the example writes itself: the named
// shape "tiny" with zero weights and a config.json naming two EOS ids.
func Example() {
	tmp, err := os.MkdirTemp("", "source-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	s, _ := model.Lookup("tiny")
	l, err := model.NewLayout(s)
	if err != nil {
		log.Fatal(err)
	}
	dir := filepath.Join(tmp, "tiny")
	if _, err := hf.ExportDir(dir, l, hf.DirOptions{}, func(w *hf.ExportWriter) error {
		for c, ch := range l.Chunks {
			if err := w.F32(c, make([]float32, ch.Len)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		log.Fatal(err)
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	json.Unmarshal(b, &cfg)
	cfg["eos_token_id"] = []int{7, 200}
	b, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)

	m, err := source.Probe(context.Background(), dir, source.Options{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d layers, dim %d, vocabulary %d (from %s)\n", m.Shape.Layers, m.Shape.Dim, m.Shape.Vocab, filepath.Base(m.ShapeFile()))
	if err := m.Open(context.Background()); err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	_, from, bytes, err := m.Tokenizer()
	if err != nil {
		log.Fatal(err)
	}
	dt, why, err := m.ParamDType()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("byte tokenizer: %v (%.5s); EOS ids %v; params %s (%s)\n", bytes, from, m.EOS(), dt, why)
	// Output:
	// 2 layers, dim 32, vocabulary 256 (from config.json)
	// byte tokenizer: true (bytes); EOS ids [7 200]; params f32 (the weights are stored in F32)
}
