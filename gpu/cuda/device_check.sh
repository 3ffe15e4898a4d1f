#!/bin/sh
# device_check.sh: the CUDA backend's checks on a GPU machine (one needs no
# Go there: the test binary is built here, CGO_ENABLED=0, and carried).
#
#   here:   sh gpu/cuda/device_check.sh build     # writes .cudabin/cuda.test
#   there:  sh gpu/cuda/device_check.sh           # carry: .cudabin/cuda.test
#
# It runs the conformance suite (gpu/gputest: every op against float64
# references and finite differences, collectives, memory, streams) on the
# CUDA backend, and the package's GPU tests: bits equal to gpu/cpu and
# cpuadam where documented, the Llama ops (GQA flash attention, RoPE, RMSNorm,
# SwiGLU, embedding without wpe, ignored targets) against gpu/cpu, attention
# positions outside [0, t] as errors, and bit-identical reruns (attention
# included).
# Its duration on a GPU is not measured yet; -test.timeout 9m bounds it.
set -e
cd "$(dirname "$0")"
if [ "$1" = build ]; then
	mkdir -p ../../.cudabin
	CGO_ENABLED=0 go test -c -o ../../.cudabin/cuda.test .
	exit
fi
exec ../../.cudabin/cuda.test -test.v -test.count 1 -test.timeout 9m \
	-test.run '^(TestProbe|TestConformance|TestDeterministic|TestMatchesCPUBackend|TestLlamaOpsMatchCPUBackend|TestAttentionPositionErrors|TestAdamMatchesCPUAdam|TestHostRegistrar|TestKernelsCompile)$' "$@"
