// Package config reads Strata's run configuration from a DeepSpeed JSON file.
//
// The file is a DeepSpeed JSON config (the keys DeepSpeed users already
// have, with DeepSpeed's meaning and defaults) plus Strata's own keys under
// "strata".
//
// What it owns: the key set, the defaults, the checks and the messages. It
// imports nothing of Strata but internal/; a named strata.model is resolved
// through Options.LookupShape, which cmd builds from model.Lookup.
//
// Parsing is two passes. encoding/json first checks the syntax, so that a
// malformed file is reported with its line and column (computed from
// json.SyntaxError.Offset). A token walk then builds a tree that remembers
// where every key and value starts, and a decoder reads it section by
// section: each read registers its key, so a key that no section read is
// unknown and is reported with the nearest valid key (edit distance, or the
// same key at another level). Problems are collected, not returned at the
// first: one run shows everything that is wrong, in document order.
//
// Decisions (documented for users in config/README.md):
//   - bf16 or fp16 mixed precision: bf16 by default (a missing bf16 block
//     is a notice); "fp16": {"enabled": true} trains in fp16 with
//     DeepSpeed's loss scaling (its keys and defaults: FP16,
//     internal/lossscale); both enabled, or neither, is an error.
//   - "auto" (written by the Hugging Face and DeepSpeed example configs):
//     Strata is the trainer and fills it in (auto.go), from Options.Auto
//     (cmd's --lr, --micro-batch, --warmup-steps, --steps) or documented
//     defaults, for the three batch keys, optimizer.params (lr, betas, eps,
//     weight_decay), the scheduler's warmup_min_lr, warmup_max_lr,
//     warmup_num_steps and total_num_steps, gradient_clipping, bf16/fp16
//     enabled, and reduce_bucket_size, stage3_prefetch_bucket_size,
//     stage3_param_persistence_threshold (from the hidden size, as the HF
//     integration does). Config.AutoChosen lists what was chosen; the
//     resolved values are in Config.JSON. Elsewhere "auto" is an error.
//   - --devices decides (Options.Devices, SetDevices): strata.devices is a
//     default, never a cap, as DeepSpeed's launcher decides the device
//     count. Batch errors say where each factor came from.
//   - DeepSpeed knobs that Strata accepts but does not use (overlap_comm,
//     buffer_count, pipeline_read, ...) become notices, Config.Ignored(),
//     that cmd prints once.
//   - activation_checkpointing (activations.go): the block's presence turns
//     checkpointing on, every block unless number_checkpoints (at most the
//     model's blocks) says how many; cpu_checkpointing is read; the block's
//     other knobs, when true, are notices saying what Strata does instead.
//     strata.activation_dtype ("bf16", "fp32") keeps fp32 activations for
//     checks.
//   - strata.optimizer_state.moments ("fp32", "bf16", "int8") is the stored
//     precision of Adam's moments of an offloaded optimizer; DeepSpeed's
//     bf16.bf16_optimizer_states is read as "bf16" (a contradiction is an
//     error), bf16.bf16_master_weights_and_grads true is refused (a bf16
//     master is not the fp32 run); strata.optimizer_state.master
//     "bf16+remainder" keeps the master as the bf16 param plus the bits
//     the rounding dropped (bit-identical to "fp32"; bf16 training with
//     the optimizer offloaded). Unset, it is the remainder with
//     offload_optimizer "nvme" in bf16 and "fp32" elsewhere
//     (Config.MasterFormat).
//
// Lifecycle: Parse (or Load, or Default) returns a *Config that is resolved
// and valid; SetDevices re-derives the batch for another device count;
// ResolveModel records a shape looked up later. A Config is a plain value:
// not safe for concurrent mutation, free to copy and to read from any
// goroutine. Printing it (Config.JSON) gives a file that Parse reads back.
//
// Memory: none to speak of; the tree of a config file is dropped after Parse.
package config
