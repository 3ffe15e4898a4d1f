package engine

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/model"
)

// Frozen parameters (strata.freeze).
//
// The chunk is the unit of movement and of optimizer state, so freezing
// works on whole chunks: strata.freeze's patterns, matched against the
// tensor names of model.Layout, must cover every tensor of a chunk or none
// of it. A frozen chunk keeps its params where params live (they still
// move for the forward and backward, as params: gathers, tier-store
// reads) and nothing else: no gradient buffer, shard or host copy, no
// reduction, no master, m or v on any tier (no host RAM, no NVMe space or
// traffic), no update, and its gradient is not in the global norm.
//
// The model still calls Params.Grad and Params.GradReady for every chunk
// (model.AccessOrder), but skips the weight and bias gradient GEMMs of a
// frozen chunk: the hooks implement model.FrozenParams, so its backward
// computes only the gradients that flow through it. Grad hands it a
// scratch buffer (one per rank, allocated at New, the size of the largest
// frozen chunk, shared by every frozen chunk and never read), which only
// the norms' gains still accumulate into, and GradReady does nothing.
// LoRA's base is frozen this way (estimate.FrozenChunks).
//
// Checkpoints hold every state of every chunk (the files do not depend on
// the freeze set): a frozen chunk saves its params, as master its params
// widened to fp32 (exact), and zero m and v. Restored with another freeze
// set, a chunk that trained in the checkpoint and is frozen now keeps the
// checkpoint's params and drops its optimizer state; a chunk frozen in the
// checkpoint that trains now is refused (the checkpoint holds no optimizer
// state for it, and Adam's step count is the run's: zero moments at a late
// step would make its first updates larger than a fresh Adam's).

// frozenNames lists the frozen chunks by name.
func frozenNames(l *model.Layout, frozen []bool) []string {
	var out []string
	for c, f := range frozen {
		if f {
			out = append(out, l.Chunks[c].Name)
		}
	}
	return out
}

// isFrozen says whether chunk c is frozen.
func (e *Engine) isFrozen(c int) bool { return e.chunks[c].frozen }

// savedFreeze is the freeze set of the run that saved a checkpoint, from
// the config it holds (strata.freeze; none in a config without it).
func savedFreeze(l *model.Layout, configJSON []byte) ([]bool, error) {
	if len(configJSON) == 0 {
		return nil, nil
	}
	var doc struct {
		Strata struct {
			Freeze []string `json:"freeze"`
		} `json:"strata"`
	}
	if err := json.Unmarshal(configJSON, &doc); err != nil {
		return nil, fmt.Errorf("the checkpoint's config: %w", err)
	}
	f, err := estimate.FrozenChunks(l, doc.Strata.Freeze)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint's strata.freeze: %w", err)
	}
	return f, nil
}

// checkFreezeRestore refuses a checkpoint in which a chunk that trains in
// this engine was frozen: it holds no optimizer state for it. A chunk that
// trained in the checkpoint and is frozen here keeps the checkpoint's
// params; its optimizer state is not read.
func (e *Engine) checkFreezeRestore(configJSON []byte, step int64) error {
	saved, err := savedFreeze(e.layout, configJSON)
	if err != nil {
		return err
	}
	var bad []string
	for c, f := range saved {
		if f && !e.isFrozen(c) {
			bad = append(bad, fmt.Sprintf("%q", e.layout.Chunks[c].Name))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("chunk %s was frozen in the checkpoint (its strata.freeze) and trains in this run: the checkpoint holds no optimizer state for it, and starting its Adam moments from zero at step %d would not be a fresh Adam (the step count is the run's); keep it frozen (strata.freeze), or start a new run from the checkpoint's weights (strata export)",
		strings.Join(bad, ", "), step)
}

// frozenGradElems is the length of each rank's gradient scratch of the
// frozen chunks: the largest frozen chunk (0 with nothing frozen).
func (e *Engine) frozenGradElems() int {
	n := 0
	for _, p := range e.chunks {
		if p.frozen {
			n = max(n, p.len)
		}
	}
	return n
}
