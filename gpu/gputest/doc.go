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
//     op is given) and for identical bits on a second call; the Llama
//     family's ops (llama.go) and the token ops with ignored targets and
//     positions (tokens.go);
//   - finite-difference gradient checks of every backward op (GEMM, bias,
//     layernorm, RMSNorm, attention, rotary, GELU, SwiGLU, cross-entropy,
//     embedding) against float64;
//   - contracts: every Device, Ops and Comm call with a bad argument
//     (length, dtype, dimension, range, device, stream, foreign or freed
//     buffer, op, root) panics when it is made, without crashing inside
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
