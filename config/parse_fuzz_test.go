package config_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/config"
)

// FuzzParse: a DeepSpeed config (the user's file, so anything) parses to a
// config or to an error with its position, never panics, parses the same
// way twice, and a config it accepts prints (JSON) to a file that parses
// to the same print. Seeded with testdata/configs and the inline configs
// of the message tests.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("..", "testdata", "configs", "*.json"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no configs in testdata/configs: %v", err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		`[1]`, "{\n\"train_micro_batch_size_per_gpu\": 2.5}", `{"Train_Batch_Size": 4}`,
		`{"train_micro_batch_size_per_gpu": 1, "aio": {"thread_count": 2, "intra_op_parallelism": 4}}`,
		`{"train_micro_batch_size_per_gpu": 1, "aio": {"block_size": 1000}}`,
		`{"train_micro_batch_size_per_gpu": 1, "strata": {"hbm_bytes": "12 parsecs"}}`,
		`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu", "bogus": 1}}}`,
		`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"cpu_offload": true}}`,
		`{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}}`,
		`{"train_micro_batch_size_per_gpu": 1, "strata": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256, "max_seq_len": 64}}}`,
		`{"train_micro_batch_size_per_gpu": 1, "strata": {"seq_len": 4096}}`,
		`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"reduce_bucket_size": "auto"}, "strata": {"model": "gpt2"}}`,
		`{"train_batch_size": 30, "gradient_accumulation_steps": 4, "strata": {"devices": 2}}`,
		`{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": "auto"}`,
		`{"train_micro_batch_size_per_gpu": 1, "xyzzy": 1}`, "\xef\xbb\xbf{}", `{"a": [1, {"b": "\u00e9"}], }`,
	} {
		f.Add([]byte(s))
	}
	opts := config.Options{LookupShape: lookup}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		// Bounded time: a hang is a failure (the fuzzer itself waits).
		done := make(chan struct{})
		go func() {
			defer close(done)
			checkParse(t, b, opts)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Parse (or its print and reparse) has not returned after 10 s")
		}
	})
}

// checkParse is FuzzParse's check of one input (t.Errorf only: it runs on
// its own goroutine).
func checkParse(t *testing.T, b []byte, opts config.Options) {
	c, err := config.Parse(b, "f.json", opts)
	c2, err2 := config.Parse(b, "f.json", opts)
	if err != nil {
		if c != nil || !strings.HasPrefix(err.Error(), "config: ") && !strings.Contains(err.Error(), "problems:") {
			t.Errorf("error %q with a config %v", err, c)
		}
		if err2 == nil || err2.Error() != err.Error() {
			t.Errorf("parsed twice: %v, then %v", err, err2)
		}
		return
	}
	if err2 != nil || !bytes.Equal(c.JSON(), c2.JSON()) {
		t.Errorf("parsed twice: %s, then %s, %v", c.JSON(), c2.JSON(), err2)
		return
	}
	back, err := config.Parse(c.JSON(), "printed.json", opts)
	if err != nil {
		t.Errorf("the print of an accepted config is refused: %v\n%s", err, c.JSON())
		return
	}
	if !bytes.Equal(back.JSON(), c.JSON()) {
		t.Errorf("printed twice:\n%s\n%s", c.JSON(), back.JSON())
	}
}
