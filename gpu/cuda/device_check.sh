#!/bin/sh
# device_check.sh: the CUDA backend's checks on a GPU machine (one needs no
# Go there: the binaries are built here, CGO_ENABLED=0, and carried).
#
#   here:   sh gpu/cuda/device_check.sh build      # writes .cudabin/cuda.test and .cudabin/strata
#   there:  sh gpu/cuda/device_check.sh            # the package's GPU tests; carry .cudabin
#   there:  sh gpu/cuda/device_check.sh multirank  # several ranks on one GPU; carry .cudabin
#
# The default mode runs the conformance suite (gpu/gputest: every op against
# float64 references and finite differences, collectives, memory, streams)
# on the CUDA backend, and the package's GPU tests: bits equal to gpu/cpu and
# cpuadam where documented, the Llama ops (GQA flash attention, RoPE, RMSNorm,
# SwiGLU, embedding without wpe, ignored targets) against gpu/cpu, attention
# positions outside [0, t] as errors, and bit-identical reruns (attention
# included). Its duration on a GPU is not measured yet; -test.timeout 9m
# bounds it.
#
# multirank (issue 12, item 4; estimated at 3 minutes, not measured yet;
# every part is under a timeout, so at most about 9 minutes if all hang):
#   1. `strata train` with 2 and then 4 logical ranks on the GPU (the backend
#      maps rank r to GPU r % GPUs), ZeRO stage 3 with params and optimizer
#      state offloaded to host RAM (testdata/configs/ds_zero3_offload.json,
#      the tiny model), 20 steps, five runs each, each under a timeout that
#      sends SIGQUIT (GOTRACEBACK=all: every goroutine's stack in the log)
#      instead of hanging; the five runs' losses and gradient norms must be
#      bit-identical (strata.deterministic, the default);
#   2. one rank with strata.deterministic false: NCCL's communicator in a
#      training run (NCCL puts at most one rank on a GPU);
#   3. the package's collective tests: a one-rank NCCL communicator's
#      collectives, NCCL refused for ranks sharing a GPU, the rank-order
#      scratch inside the budget, and the conformance suite's collectives
#      (rotated reads, the two-phase AllReduce, bit for bit);
#   4. the README's hang command (bench step, medium, nvme, 4 MiB of tier
#      HBM), under the same kind of timeout.
# Logs and run directories go to $OUT/multirank (the device tool's $OUT
# comes back) or /tmp/multirank. Knobs, for a dry run on the CPU backend
# here (gpu/cuda's TestDeviceScript does one): STRATA_BIN, BACKEND (cuda),
# RANKS ("2 4"), RUNS (5), STEPS (20), RUN_TIMEOUT (seconds, 60), CUDA_TEST
# (.cudabin/cuda.test; skipped when absent), HANG (1; 0 skips step 4).
set -e
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)

# train_run DIR TIMEOUT ARGS...: strata train under a SIGQUIT timeout;
# its output in DIR.log. Returns 124 on a timeout, else train's status.
train_run() {
	dir=$1
	limit=$2
	shift 2
	rc=0
	GOTRACEBACK=all timeout -s QUIT -k 15 "$limit" "$STRATA_BIN" train "$@" --backend "$BACKEND" --no-progress --out "$dir" >"$dir.log" 2>&1 || rc=$?
	return $rc
}

# fingerprint DIR: the losses and gradient norms of a run, one step a line.
fingerprint() {
	sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2 \3/p' "$1/steps.jsonl"
}

# field DIR KEY: a string field of the run's summary.json.
field() {
	sed -n "s/.*\"$2\": \"\\([^\"]*\\)\".*/\\1/p" "$1/summary.json" | head -n 1
}

multirank() {
	: "${STRATA_BIN:=$root/.cudabin/strata}" "${BACKEND:=cuda}" "${RANKS:=2 4}" "${RUNS:=5}" "${STEPS:=20}"
	: "${RUN_TIMEOUT:=60}" "${CUDA_TEST:=$root/.cudabin/cuda.test}" "${HANG:=1}"
	out=${OUT:-/tmp}/multirank
	rm -rf "$out"
	mkdir -p "$out"
	cfg=$root/testdata/configs/ds_zero3_offload.json
	failed=0
	report=""
	for n in $RANKS; do
		ok=0
		hung=""
		for run in $(seq 1 "$RUNS"); do
			dir=$out/n$n-run$run
			rc=0
			train_run "$dir" "$RUN_TIMEOUT" --config "$cfg" --devices "$n" --steps "$STEPS" || rc=$?
			if [ "$rc" -eq 124 ]; then
				hung="run $run hung (goroutine dump in $dir.log)"
				echo "== $n ranks, run $run: HUNG after ${RUN_TIMEOUT}s; the goroutine dump, functions only (all of it in $dir.log):"
				awk '/^goroutine /{p=1} p' "$dir.log" | grep -v '^[[:space:]]' | head -n 120 || true
				break
			fi
			if [ "$rc" -ne 0 ]; then
				echo "== $n ranks, run $run: exit $rc"
				tail -n 20 "$dir.log"
				continue
			fi
			fingerprint "$dir" >"$dir.fp"
			if [ "$(wc -l <"$dir.fp")" -ne "$STEPS" ]; then
				echo "== $n ranks, run $run: $(wc -l <"$dir.fp") of $STEPS steps in steps.jsonl"
				continue
			fi
			if [ "$run" -gt 1 ] && ! cmp -s "$out/n$n-run1.fp" "$dir.fp"; then
				echo "== $n ranks, run $run: losses or gradient norms differ from run 1:"
				diff "$out/n$n-run1.fp" "$dir.fp" | head -n 6
				continue
			fi
			ok=$((ok + 1))
		done
		line="$n ranks: $ok/$RUNS runs completed, bit-identical to run 1"
		[ -n "$hung" ] && line="$line; $hung"
		[ -f "$out/n$n-run1/summary.json" ] && line="$line; collectives: $(field "$out/n$n-run1" collectives)"
		report="$report$line
"
		[ "$ok" -eq "$RUNS" ] || failed=1
	done

	# NCCL in a training run: one rank, strata.deterministic false.
	sed '1s/{/{ "strata": {"deterministic": false},/' "$cfg" >"$out/nccl.json"
	rc=0
	train_run "$out/nccl-1rank" "$RUN_TIMEOUT" --config "$out/nccl.json" --devices 1 --steps "$STEPS" || rc=$?
	if [ "$rc" -eq 0 ]; then
		report="${report}1 rank, strata.deterministic false: completed; collectives: $(field "$out/nccl-1rank" collectives)
"
	else
		report="${report}1 rank, strata.deterministic false: exit $rc (log $out/nccl-1rank.log)
"
		tail -n 20 "$out/nccl-1rank.log"
		failed=1
	fi

	if [ -x "$CUDA_TEST" ]; then
		rc=0
		"$CUDA_TEST" -test.v -test.count 1 -test.timeout 90s \
			-test.run '^(TestNCCLOneRank|TestNCCLNeedsAGPUPerRank|TestCollectiveScratchInBudget)$' >"$out/cuda-test.log" 2>&1 || rc=$?
		"$CUDA_TEST" -test.v -test.count 1 -test.timeout 90s \
			-test.run '^TestConformance$/^Collectives$' >>"$out/cuda-test.log" 2>&1 || rc=$?
		grep -E '^(---|ok|FAIL|PASS)|--- FAIL|\.go:[0-9]+: ' "$out/cuda-test.log" || true
		report="${report}collective tests (cuda.test): exit $rc (log $out/cuda-test.log)
"
		[ "$rc" -eq 0 ] || failed=1
	else
		report="${report}collective tests: skipped, no $CUDA_TEST
"
	fi

	if [ "$HANG" = 1 ] && [ "$BACKEND" = cuda ]; then
		rc=0
		GOTRACEBACK=all timeout -s QUIT -k 15 120 "$STRATA_BIN" bench step --backend cuda --model medium \
			--tier-hbm 4MiB --host-budget 123.5MiB --modes nvme >"$out/hang.log" 2>&1 || rc=$?
		report="${report}README's hang command (bench step --model medium --modes nvme --tier-hbm 4MiB): exit $rc$([ "$rc" -eq 124 ] && echo ', HUNG: goroutine dump in the log') (log $out/hang.log)
"
		[ "$rc" -eq 0 ] || failed=1
		tail -n 12 "$out/hang.log"
	fi

	echo "== multirank summary"
	printf '%s' "$report"
	return $failed
}

case "$1" in
build)
	mkdir -p "$root/.cudabin"
	CGO_ENABLED=0 go test -c -o "$root/.cudabin/cuda.test" .
	(cd "$root" && CGO_ENABLED=0 go build -o .cudabin/strata .)
	exit
	;;
multirank)
	shift
	rc=0
	multirank "$@" || rc=$?
	exit $rc
	;;
esac
exec "$root/.cudabin/cuda.test" -test.v -test.count 1 -test.timeout 9m \
	-test.run '^(TestProbe|TestConformance|TestDeterministic|TestMatchesCPUBackend|TestLlamaOpsMatchCPUBackend|TestAttentionPositionErrors|TestAdamMatchesCPUAdam|TestHostRegistrar|TestKernelsCompile|TestNCCLOneRank|TestNCCLNeedsAGPUPerRank|TestCollectiveScratchInBudget)$' "$@"
