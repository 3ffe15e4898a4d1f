package config_test

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestAIORanges: aio values the NVMe engine would clamp are refused with
// the key, its range and the value, at the value's position.
func TestAIORanges(t *testing.T) {
	const head = `{"train_micro_batch_size_per_gpu": 1, "aio": `
	for _, tc := range []struct{ aio, want string }{
		{`{"queue_depth": 1e9}`, `config: ds.json:1:62: aio.queue_depth: 1000000000 is out of range: want 1 to 4096`},
		{`{"thread_count": 1e5}`, `config: ds.json:1:63: aio.thread_count: 100000 is out of range: want 1 to 64`},
		{`{"intra_op_parallelism": 100}`, `config: ds.json:1:71: aio.intra_op_parallelism: 100 is out of range: want 1 to 64`},
		{`{"block_size": 1073741824}`, `config: ds.json:1:61: aio.block_size: 1073741824 (1.00 GiB) is out of range: want 4096 to 67108864 (64.0 MiB), a multiple of 4096`},
		{`{"block_size": "1GiB"}`, `config: ds.json:1:61: aio.block_size: 1073741824 (1.00 GiB) is out of range: want 4096 to 67108864 (64.0 MiB), a multiple of 4096`},
		{`{"queue_depth": 1024, "thread_count": 8}`, `config: ds.json:1:68: aio.thread_count: queue_depth 1024 × thread_count 8 = 8192 requests in flight is more than the NVMe engine's 4096: lower either`},
	} {
		_, err := config.Parse([]byte(head+tc.aio+"}"), "ds.json", config.Options{})
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s:\n got %v\nwant %s", tc.aio, err, tc.want)
		}
	}
	for _, aio := range []string{`{"queue_depth": 4096}`, `{"thread_count": 64, "queue_depth": 64}`, `{"block_size": 67108864}`, `{"block_size": 4096}`} {
		if _, err := config.Parse([]byte(head+aio+"}"), "ds.json", config.Options{}); err != nil {
			t.Errorf("%s: %v", aio, err)
		}
	}
}

// TestNumberOutOfRangePosition: a number encoding/json cannot hold (1e400)
// is reported at its line and column, with its key.
func TestNumberOutOfRangePosition(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{"{\n  \"train_micro_batch_size_per_gpu\": 1,\n  \"gradient_clipping\": 1e400\n}", "config: ds.json:3:24: gradient_clipping: 1e400 is out of range"},
		{"{\n  \"train_micro_batch_size_per_gpu\": 1e400\n}", "config: ds.json:2:37: train_micro_batch_size_per_gpu: 1e400 is out of range"},
	} {
		_, err := config.Parse([]byte(tc.json), "ds.json", config.Options{})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant %s…", tc.json, err, tc.want)
		}
	}
}
