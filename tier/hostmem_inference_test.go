package tier

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/pinned"
)

// TestCheckHostMemoryInference: a pool the host cannot give is refused
// with a way out that exists: for a training engine, the optimizer state
// on NVMe; for an inference engine (strata eval --offload, which has no
// optimizer state), fewer windows at a time or the params on NVMe, never
// the optimizer state.
func TestCheckHostMemoryInference(t *testing.T) {
	meminfo := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(meminfo, []byte("MemTotal:       25165824 kB\nMemAvailable:        128 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sizes := Sizes{Ranks: 1, OptimizerOnHost: true, Static: true, HomeBytes: 64 << 20, StagingBytes: 1 << 20}
	err := CheckHostMemory(sizes, 4096, pinned.LockNever, meminfo)
	if err == nil || !strings.Contains(err.Error(), "put the optimizer state on NVMe (offload_optimizer nvme)") {
		t.Fatalf("training: %v", err)
	}
	sizes.Inference = true
	err = CheckHostMemory(sizes, 4096, pinned.LockNever, meminfo)
	if err == nil || strings.Contains(err.Error(), "optimizer state on NVMe") ||
		!strings.Contains(err.Error(), "an evaluation has no optimizer state: evaluate fewer windows at a time (train_micro_batch_size_per_gpu; strata eval's --batch), or put the params on NVMe") {
		t.Fatalf("inference: %v", err)
	}
}
