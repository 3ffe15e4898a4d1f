package hf_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
)

// Example writes a model's weights as a Hugging Face directory, as
// save_pretrained does (config.json, model.safetensors under transformers'
// names), and reads its config.json back as the same shape.
func Example() {
	dir, err := os.MkdirTemp("", "hf-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s, err := model.Lookup("tiny")
	if err != nil {
		log.Fatal(err)
	}
	l, err := model.NewLayout(s)
	if err != nil {
		log.Fatal(err)
	}
	out := filepath.Join(dir, "tiny-gpt2")
	if _, err := hf.ExportDir(out, l, hf.DirOptions{}, func(w *hf.ExportWriter) error {
		for c, ch := range l.Chunks {
			if err := w.F32(c, make([]float32, ch.Len)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		log.Fatal(err)
	}
	cfg, err := hf.ReadConfig(out)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s, the same shape: %v\n", cfg.Architecture, cfg.Shape.Canonical() == s.Canonical())
	// Output:
	// GPT2LMHeadModel, the same shape: true
}
