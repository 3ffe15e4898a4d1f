package cmd

import (
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/shard"
)

// frozenJSON is summary.json's "frozen": the chunks strata.freeze froze,
// their parameters, and the model state they do not keep (all ranks; the
// device figure per device, as model_state_peak_bytes is).
func frozenJSON(s engine.Summary) map[string]any {
	return map[string]any{
		"chunks":                      s.FrozenChunks,
		"params":                      s.FrozenParams,
		"optimizer_state_saved_bytes": s.FrozenOptimizerSavedBytes(),
		"grad_saved_bytes":            s.FrozenGradSavedBytes(),
		"saved_device_bytes":          s.FrozenSavedTierBytes(shard.HBM) / int64(max(s.Devices, 1)),
		"saved_host_bytes":            s.FrozenSavedTierBytes(shard.Host),
		"saved_nvme_bytes":            s.FrozenSavedTierBytes(shard.NVMe),
	}
}
