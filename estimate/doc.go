// Package estimate is the arithmetic of a ZeRO run's memory.
//
// # Memory arithmetic
//
// For mixed-precision Adam a model of Ψ parameters has 16Ψ bytes of model
// state: bf16 params 2Ψ, bf16 grads 2Ψ, fp32 master, m and v 12Ψ. Per device
// on N devices, with the optimizer on the device:
//
//	stage 0  16Ψ           everything replicated
//	stage 1  4Ψ + 12Ψ/N    optimizer state sharded
//	stage 2  2Ψ + 14Ψ/N    gradients sharded too
//	stage 3  16Ψ/N         parameters sharded too
//
// With the optimizer on the host (ZeRO-Offload) the device keeps the bf16
// params (2Ψ, or 2Ψ/N at stage 3) and grads (2Ψ at stages 0-1, 2Ψ/N at 2-3),
// and the host holds 12Ψ/N per rank plus the reduced gradient shard; with
// offload_param the param shards leave the device too (stage 3).
//
// Layout rule the engine (package engine) follows so that measured bytes equal the estimate:
// parameters are packed in chunks (ChunkParams: embeddings, one per block,
// final norm and an untied output head); every chunk is sharded over the N
// ranks with each rank's slice ShardElems long (ceil(chunk/N) rounded up to DefaultShardAlignElems
// = 64 elements, zero padded; the tier store pads its own host buffers and
// NVMe extents to the I/O alignment, and the planner counts shards at those
// padded sizes, IOAlignBytes); a gathered or replicated chunk occupies N·ShardElems
// elements; at stage 3, chunks with fewer parameters than
// stage3_param_persistence_threshold stay gathered on every device. The
// padding is zero and stays zero through Adam (zero grad, zero moments).
//
// # What it covers
//
// Memory (Options, ModelState) is one rank's model state per state and
// tier, exact to the byte for the engine's layout, next to the reference
// text's formula (Coef); Stages is the same for stages 0-3. It places the
// shards a host budget keeps in host RAM exactly as the tier store does
// (ModelState.HostKept, TierHostBudget, HostStagingBytes, TierSpareBytes),
// every shard rounded up to IOAlignBytes. Activations (ActivationMemory)
// is one device's activation memory by term, WorkingSetOf its transient
// working set. OptionsFromConfig and ActivationOptionsFromConfig read a
// config; FrozenChunks resolves strata.freeze's patterns to whole chunks
// (a substring, or a path.Match glob over the whole name when it has
// * ? [) and refuses a pattern that matches nothing, a set that covers
// part of a chunk, or one that freezes every chunk.
//
// # A whole estimate
//
// New is what `strata estimate` computes, as one call: a Request (the
// model-state Options, a shape or a parameter count, the stage or all of
// them, LoRA or frozen patterns, the micro-batch) becomes a Report, the
// model state of each stage and with a shape each device's activations,
// working set and which configuration fits a budget. RequestFromConfig
// fills a Request from a resolved config, FromConfig estimates it.
// Report.WriteText is the CLI's table, Report.JSON its --json (tagged
// JSONReport); a request New refuses is a *RequestError naming its part
// (Input), so that a caller can name its own flag or key.
//
// # Activations
//
// ActivationOptionsFromConfig is how the engine keeps a model's
// activations: bf16 in bf16 mixed precision unless strata.activation_dtype
// is fp32; activation checkpointing and cpu_checkpointing from the
// activation_checkpointing block. Activations is what they take per
// device, the tier store's room for restored block inputs included, and
// the engine's Summary reports its measured peak beside it.
//
// # Frozen chunks
//
// A frozen chunk (Options.Frozen) costs its params only: Memory counts no
// gradient and no master, m, v for it, the formula's gradient and
// optimizer terms are then on Ψₜ, the trainable parameters (Coef), and
// ModelState.FrozenSavedPerRank is what freezing saves.
//
// The package imports no engine: `strata estimate` (cmd) uses it without
// one, and the engine sizes its shards, budgets and Summary with it, so
// what the engine measures equals what it prints.
package estimate
