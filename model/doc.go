// Package model is a GPT-2-style decoder whose forward and backward passes
// run through gpu.Ops: token and position embeddings, L pre-LN blocks
// (causal self-attention, MLP with GELU), a final layernorm and an output
// head tied to the token embedding. It also holds the byte-level tokenizer
// (vocabulary 256: any file is training data), a deterministic batch
// sampler, and the plain single-device training loop (Trainer) that the
// ZeRO engine is compared with.
//
// What it owns:
//   - Shape and the named shapes (tiny .. gpt-7b) with their parameter counts;
//   - Layout: the parameters grouped in chunks, the unit of movement of
//     docs/DESIGN.md (chunk 0 embeddings, 1..L one block each, L+1 the final
//     layernorm), each a flat run of elements with named tensors at fixed
//     offsets, and their seeded GPT-2 initialisation per chunk;
//   - Model: the activations of one micro-batch shape and the passes;
//   - Params: the interface through which a pass reaches parameter and
//     gradient memory chunk by chunk, in the fixed order AccessOrder lists,
//     and Resident, its all-on-one-device implementation;
//   - Encode/Decode; Corpus, the text a Sampler reads a window at a time,
//     held in memory (Tokens) or read from a regular file with pread
//     (FileCorpus, one token per byte); Sampler, Trainer and Train.
//
// Lifecycle: NewLayout(shape) → Layout.Init(seed) gives host fp32 chunks;
// New(dev, layout, batch, seq) allocates the activations; per micro-batch
// Forward, Backward (optional), then Loss (or Losses, once for several
// micro-batches); Free releases the activations. A Params call that fails
// ends the pass: Forward or Backward returns its error unchanged and makes
// no further call.
// NewTrainer builds all of it on one device and Step runs one optimizer step.
//
// Memory rules: the model never allocates parameters or gradients; it reads
// chunk c only between Params.Acquire and Params.Release and accumulates
// into a gradient only between Params.Grad and Params.GradReady. Its own
// device memory is the activations, allocated once by New (tagged
// gpu.Activation, ActivationBytes(shape, batch, seq) bytes: per token
// 16·C + 4 floats per block plus H·T attention probabilities, the logits
// and their gradient, and 6·C floats of backward scratch), so activation
// memory is bounded by the micro-batch shape and does not grow during a
// pass. Activations are fp32; parameters and gradients are F32 or BF16 as
// the Params hand them out. Host memory: small staging buffers for the token
// ids and per-token losses; a Sampler's batch holds only its rows' windows
// (a FileCorpus keeps nothing per byte of its file).
package model
