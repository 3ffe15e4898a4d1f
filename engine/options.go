package engine

import (
	"fmt"
	"runtime"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/pinned"
)

// Options configure an Engine beyond its config file.
type Options struct {
	// Tokens is the training corpus (byte-level ids, model.Encode). nil
	// reads strata.data from the config (LoadCorpus), or the built-in
	// synthetic corpus when that is empty too.
	Tokens []int32
	// Precision is the dtype of the device params and grads: gpu.BF16
	// (default, the config's bf16 mixed precision: fp32 master weights and
	// moments) or gpu.F32 (fp32 everywhere, the params are the master
	// weights). The config has no fp32 mode; this is for library users and
	// the tests.
	Precision gpu.DType
	// OptimizerThreads is the number of goroutines of the host optimizer
	// (cpuadam) when offload_optimizer.device is cpu; 0 = GOMAXPROCS.
	OptimizerThreads int
	// MaxLiveChunks bounds, at stage 3, the gathered chunks each device
	// holds at once (the chunk in use and the next one, prefetched): 0 = 2.
	// When a gather would exceed it, the rank waits for the oldest
	// released chunk's last use and frees it.
	MaxLiveChunks int
	// PinnedLock is the mlock policy of the pinned host buffers (gradient
	// shards and parameter uploads) of the host optimizer.
	PinnedLock pinned.LockMode
}

func (o Options) withDefaults() Options {
	if o.Precision == 0 {
		o.Precision = gpu.BF16
	}
	if o.OptimizerThreads == 0 {
		o.OptimizerThreads = runtime.GOMAXPROCS(0)
	}
	if o.MaxLiveChunks == 0 {
		o.MaxLiveChunks = 2
	}
	return o
}

// Validate says what is wrong with o (after defaults).
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Precision != gpu.BF16 && o.Precision != gpu.F32:
		return fmt.Errorf("engine: precision %s is not bf16 or f32", o.Precision)
	case o.OptimizerThreads < 1:
		return fmt.Errorf("engine: optimizer threads %d must be >= 1", o.OptimizerThreads)
	case o.MaxLiveChunks < 2:
		return fmt.Errorf("engine: max live chunks %d must be >= 2 (the chunk in use and the next)", o.MaxLiveChunks)
	}
	return nil
}

func (o Options) String() string {
	o = o.withDefaults()
	src := "config"
	if o.Tokens != nil {
		src = fmt.Sprintf("%d tokens", len(o.Tokens))
	}
	return fmt.Sprintf("engine.Options{Data: %s, Precision: %s, OptimizerThreads: %d, MaxLiveChunks: %d, PinnedLock: %s}",
		src, o.Precision, o.OptimizerThreads, o.MaxLiveChunks, o.PinnedLock)
}
