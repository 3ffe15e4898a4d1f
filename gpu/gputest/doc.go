// Package gputest is the conformance suite every gpu backend must pass. Run
// creates fresh devices through the backend's constructor for each group of
// tests and checks, using only the gpu interfaces:
//
//   - memory: zeroed allocation, accounting per kind and purpose, peaks,
//     ResetPeak, the out-of-memory error and its text, double free, views;
//   - copies host↔device and device↔device (same and different devices) and
//     the link counters;
//   - stream ordering, events across streams and devices, errors raised by
//     ops and reported by Synchronize;
//   - collectives with N = 1..4: exact bits against the documented fixed
//     order, identical on every rank and across two runs; calls that
//     disagree are an error, not a deadlock;
//   - every op against a plain float64 reference, with F32 and BF16 storage
//     and odd sizes; attention (attention.go) at head dimensions 64 and 128
//     and small ones, seq not a multiple of any usual tile, several
//     batch×head counts, grouped-query ratios 1, 2 and 4 and packed
//     examples, its backward against a float64 backward (with the out the
//     op is given) and for identical bits on a second call; its options
//     (gpu.AttnOptions) with packed examples and grouped heads: sliding
//     windows shorter than the sequence, of one key, and as long as it or
//     longer (the full attention's bits), Gemma 2's soft cap, a custom
//     scale, forward, backward, gradients and against a key/value cache
//     (attention_cached.go: windows shorter than the cache); the Llama
//     family's ops (llama.go: rotary embeddings with partial Dims, Scale ≠
//     1 and inverse frequencies of their own; GLU with SwiGLU and GeGLU)
//     and the token ops with ignored targets and positions (tokens.go:
//     cross-entropy with and without a final soft cap);
//   - finite-difference gradient checks of every backward op (GEMM, bias,
//     layernorm, RMSNorm, attention with and without its options, rotary
//     (whole and partial), GELU, SwiGLU and GeGLU, cross-entropy with and
//     without a soft cap, embedding) against float64;
//   - contracts: every Device, Ops and Comm call with a bad argument
//     (length, dtype, dimension, range, device, stream, foreign or freed
//     buffer, op, root; attention options with a negative window or scale
//     or a NaN or negative soft cap; a Rope whose Dims is odd, zero or
//     past the head, whose InvFreq has the wrong length or a value that is
//     not finite and positive, or whose Scale is 0; a cross-entropy soft
//     cap that is NaN, negative or infinite) panics when it is made, without crashing inside
//     the backend, enqueues nothing and takes no collective round.
//
// Tolerances (per element, ref = the float64 reference on the values the
// device actually stores, mag = the sum of the magnitudes of the terms
// that make the element): fp32 arithmetic |got-ref| <= 1e-5*mag (GEMM over
// k terms: the rounding error grows like sqrt(k)*2^-24*mag, 1e-5 leaves a
// wide margin for k < 1000); a bf16 output adds 2^-8*|ref| (one rounding to
// an 8-bit significand is at most 2^-9 relative). Gradient checks: the
// backend's fp32 backward against a central difference (h = 1e-6) of the
// float64 forward, |got-fd| <= 1e-4*max|fd| + 1e-4*|fd|: the truncation
// error of the difference is ~h^2 and the fp32 backward is ~1e-6
// relative, while a wrong formula is off by O(1). Attention's output
// magnitude adds the effect of an fp32 score's rounding (attentionRef);
// its bf16 finite-difference check allows 4·2^-8 of the largest gradient,
// as the backward reads the bf16-rounded out (gradAttention).
package gputest
