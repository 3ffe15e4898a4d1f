// Package model holds the decoders Strata trains, GPT-2 and the Llama family.
//
// Their forward and backward passes run through gpu.Ops: GPT-2 (token and
// learned position embeddings, L pre-LN blocks of causal self-attention and
// a GELU MLP, a final layernorm, an output head tied to the token embedding)
// and the Llama family (token embeddings, L blocks of RMSNorm, grouped-query
// attention with rotary positions and a gated MLP, a final RMSNorm, an
// untied lm_head or a tied one) with its members' variants (rope.go): Llama
// 3.0-3.3 (every rope type of modeling_rope_utils: default, linear, dynamic,
// yarn, llama3, longrope, computed per layer and per call length), Mistral
// and Mistral-Nemo (sliding window, head_dim independent of hidden / heads),
// Qwen2 (q, k, v biases, use_sliding_window with max_window_layers), Qwen3
// (q_norm and k_norm), Phi-3 and Phi-4 (q|k|v and gate|up fused in the
// files, LongRoPE, partial rotary), Gemma 2 and Gemma 3 (RMSNorm by 1 +
// weight, embeddings times √hidden, GeGLU, norms after the attention and
// around the MLP, query_pre_attn_scalar, soft caps on the scores and the
// logits, alternating sliding layers, Gemma 3's local rope base), Mixtral
// and Qwen3-MoE (moe.go: a sparse mixture of experts in place of the MLP,
// each expert a chunk of its own, the routing on the host, the
// load-balancing loss), as Hugging Face's modeling code defines them (testdata/hf_reference.py is the float64
// PyTorch transcription the tests compare with; hf's
// TestFamiliesAgainstTorch runs every family). It also holds the byte-level
// tokenizer (vocabulary 256: any file is training data), a deterministic
// batch sampler, and the plain single-device training loop (Trainer) that
// the ZeRO engine is compared with.
//
// What it owns:
//   - Shape and the named shapes (tiny .. gpt-7b, tiny-llama, tiny-qwen2,
//     llama-3-8b/70b, qwen2-7b, mixtral-8x7b, qwen3-30b-a3b) with their
//     parameter counts (a mixture of experts' active ones too); a Shape's
//     variants (HeadDimension, Rope, RotaryFraction, SlidingWindow and
//     LayerTypes, RopeLocalTheta, QueryScale, the soft caps) give each
//     layer its gpu.Rope (RopeFor) and gpu.AttnOptions (AttnFor);
//   - Layout: the parameters grouped in chunks, the unit of movement of
//     docs/DESIGN.md (chunk 0 embeddings, 1..L one block each, L+1 the final
//     norm and an untied lm_head), each a flat run of elements with named
//     tensors at fixed offsets (Hugging Face's names for the Llama family;
//     q, k, v adjacent so one GEMM computes them, gate and up likewise), and
//     their seeded initialisation per chunk;
//   - Model: the activations of one micro-batch shape and the passes, one
//     plain function per layer (model.go drives the chunks, loss.go holds
//     the chunked loss, gpt2.go and llama.go the blocks, activations.go
//     plans the memory), kept as ActivationOptions say: their dtype, the
//     blocks recomputed in the backward (activation checkpointing), and
//     whether the checkpointed inputs leave the device (cpu_checkpointing,
//     through an InputStore);
//   - Batch: ids, targets (IgnoreTarget leaves a token out of the loss; the
//     loss is the mean over the tokens with a target, and a micro-batch
//     without any has loss 0 and adds a zero gradient) and positions (Pos
//     packs several examples in a row: positions restart at each example
//     and attention stays inside it);
//   - Params: the interface through which a pass reaches parameter and
//     gradient memory chunk by chunk, in the fixed order AccessOrder(shape)
//     lists (it depends on whether the head is tied; params.go writes both
//     orders out), and Resident, its all-on-one-device implementation;
//     InputStore, its optional interface through which a model hands its
//     checkpointed blocks' inputs away and takes them back, in the order
//     AccessOrderWith lists; ExpertRouter, its optional interface through
//     which a mixture of experts acquires only the experts its tokens
//     reach (the others passed over with SkipExpert in their place);
//   - for models defined elsewhere (a Go program's own, trained through
//     engine.Options.Model): CustomLayout (a named layout of their chunks
//     and tensors, Shape zero, Layout.Custom), Layout.Validate (the rules
//     every layout keeps) and StackOrder (the access order of a stack of
//     chunks); they reach memory through Params as Model does (net.go);
//   - Decoder (decoder.go): inference with a key/value cache, one sequence
//     on one device: Step runs new tokens (a prompt, then one generated
//     token at a time) and returns the next token's logits, Score runs a
//     window against its targets (eval); each block's keys and values of
//     the tokens so far stay in the cache and the new tokens' attention
//     reads it (gpu.Ops.AttentionCached); of a mixture of experts it
//     acquires only the experts its tokens reached, telling a Params that
//     implements ExpertPrefetcher which they are first. Weights
//     (weights.go): every parameter resident on one device (NewWeightsOf:
//     the chunks a caller keeps there) and no gradient, the Params of
//     inference;
//   - Encode/Decode; Corpus, the text a Sampler reads a window at a time,
//     held in memory (Tokens) or read from a regular file with pread
//     (FileCorpus, one token per byte); Sampler, Trainer and Train.
//
// Lifecycle: NewLayout(shape) → Layout.Init(seed) gives host fp32 chunks;
// NewWith(dev, layout, batch, seq, opts) allocates the activations (New:
// fp32, no checkpointing); per micro-batch
// Forward, Backward (optional), then Loss (or Losses, once for several
// micro-batches); Free releases the activations. A Params call that fails
// ends the pass: Forward or Backward returns its error unchanged and makes
// no further call.
// NewTrainer builds all of it on one device and Step runs one optimizer step.
// Inference: NewWeights, LoadChunk per chunk; NewDecoder(dev, layout,
// DecoderOptions) allocates the cache and one step's rows
// (DecoderBytes); Step or Score, Reset to start another sequence; Free.
//
// Memory rules: the model never allocates parameters or gradients; it reads
// chunk c only between Params.Acquire and Params.Release and accumulates
// into a gradient only between Params.Grad and Params.GradReady. Its own
// device memory is the activations, allocated once by NewWith (tagged
// gpu.Activation; ActivationTerms names them, ActivationBytesWith sums
// them): the residual stream (each block's input, C per token), per block
// not checkpointed its saved tensors (GPT-2 7C + 2F + 4 + H values per
// token, the Llama family 5C + 2·KV·D + 3F + 2 + H; attention keeps H row
// log-sum-exps, never seq×seq scores), one work set that the checkpointed
// blocks share, the final norm's output, the loss chunk (the fp32 logits
// of a slice of tokens, at most 64 MiB: the B·T·V logits are never held)
// and the backward scratch; with cpu_checkpointing the checkpointed inputs
// pass through a ring of three buffers and live in the InputStore between
// forward and backward. So activation memory is linear in batch and seq,
// bounded by the micro-batch shape and does not grow during a pass. The
// stored tensors are ActivationOptions.DType (bf16 or fp32); the norm
// statistics, the log-sum-exps, the logits of the loss chunk, the losses
// and the residual gradient are fp32, and every op computes in fp32.
// Parameters and gradients are F32 or BF16 as the Params hand them out.
// Host memory: small staging buffers for the token ids, targets, positions
// and per-token losses; a Sampler's batch holds only its rows' windows (a
// FileCorpus keeps nothing per byte of its file).
package model
