#!/bin/sh
# What a sliding window costs per token on the CPU backend (issue 39): one
# Mistral-style block (8 heads of 128, 2 key/value heads, FFN 2816) forward
# and backward over 32,768 tokens with a window of 4,096, against the same
# block over 4,096 tokens of full causal attention, and the window over
# 16,384 tokens (the per-token cost must not grow with the length). The
# three runs alternate; the benchmark reports the ratios of their medians,
# in CPU time (user + system: the work, which a loaded host does not inflate).
# Sizes: STRATA_WINDOW_LONG, _SHORT, STRATA_WINDOW, _DIM, _REPS (see
# model/window_bench_test.go). About 20 minutes on 2 cores with REPS=1.
set -e
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
exec go test ./model/ -run '^$' -bench BenchmarkSlidingWindow -benchtime 1x -timeout 2h "$@"
