#!/bin/sh
# cuda-verify.sh: the one command that measures Strata on a GPU (issue 17,
# item 5): on one H200, within 8 minutes, every part under its own timeout.
#
#   here:   sh bench/cuda-verify.sh build     # .cudabin/cuda.test and .cudabin/strata (CGO_ENABLED=0)
#   there:  sh bench/cuda-verify.sh [--parts LIST] [--dry-run]   # carry .cudabin
#           sh bench/cuda-verify.sh summarize DIR   # the summary of a finished (or partial) run
#
# Parts (default all, in this order; seconds of limit in brackets):
#   conformance [150]  gpu/cuda's conformance suite and GPU tests (cuda.test);
#                      TestProbe's log says which library runs the bf16 GEMMs
#   gpt2        [100]  strata bench step --backend cuda --model gpt2 --batch 16
#                      --seq 1024, resident, 2 warm-up + 3 measured steps
#   torch       [ 70]  the same step in PyTorch on the same GPU (bf16 autocast,
#                      SDPA flash attention, fused AdamW; bench/tools/torch_gpt2_step.py)
#   mfu         [100]  strata train: gpt-7b's block shape (C 4096, 32 heads,
#                      vocab 50257), 4 layers, batch 4 x 2048 tokens, bf16,
#                      stage 3, nothing offloaded, 4 steps; MFU of steps 2-4
#                      against the dense bf16 peak (PEAK_TFLOPS, 989 for H200 SXM)
#   offload     [ 70]  strata bench step --model gpt2 --batch 4 --seq 1024,
#                      modes resident, host and nvme, overlap exact and dpu:
#                      params bit-identical (exact), host/resident step ratio
#                      (target <= 1.10 with exact overlap), dpu's beside it
#   ranks       [ 80]  gpu/cuda/device_check.sh multirank, shortened: 2 and 4
#                      logical ranks on the GPU (tiny, stage 3, offloaded to
#                      host), 2 runs of 8 steps each, each run under a 15 s
#                      SIGQUIT timeout (a hang leaves its goroutine dump), the
#                      runs' losses and norms bit-identical; one NCCL rank
# 480 s in all at most (limits lowered when ranks came: conformance 150 ->
# 110, gpt2 100 -> 80, torch 70 -> 60, mfu 100 -> 80). A part that runs past its limit gets SIGQUIT
# (GOTRACEBACK=all: every goroutine's stack lands in its log), then SIGKILL
# 15 s later; the summary names it. Each part's log is $OUT/PART.log; the
# summary is printed and written to $OUT/summary.txt; exit status 0 when
# every part ran and passed (a target missed is reported, not a failure).
#
# Knobs: OUT (/tmp/cuda-verify), STRATA_BIN (.cudabin/strata), CUDA_TEST
# (.cudabin/cuda.test), PYTHON (python3), NVME_PATH (/tmp), PEAK_TFLOPS
# (989), BACKEND (cuda; cpu for a dry run of the timeouts here), T_CONFORMANCE,
# T_GPT2, T_TORCH, T_MFU, T_OFFLOAD, T_RANKS (limits, seconds).
# bench/cuda_verify_test.go runs the argument handling and the summary on
# canned outputs without a GPU.
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
all_parts="conformance gpt2 torch mfu offload ranks"

usage() {
	echo "usage: sh bench/cuda-verify.sh [--parts LIST] [--dry-run] | build | summarize DIR" >&2
	echo "  LIST: comma-separated, of: $(echo $all_parts | tr ' ' ',')" >&2
	exit 2
}

limit_of() {
	case $1 in
	conformance) echo "${T_CONFORMANCE:-110}" ;;
	gpt2) echo "${T_GPT2:-80}" ;;
	torch) echo "${T_TORCH:-60}" ;;
	mfu) echo "${T_MFU:-80}" ;;
	offload) echo "${T_OFFLOAD:-70}" ;;
	ranks) echo "${T_RANKS:-80}" ;;
	esac
}

# mfu_config: the 4-layer gpt-7b-shape training config.
mfu_config() {
	cat <<-JSON
	{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true},
	 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
	 "zero_optimization": {"stage": 3},
	 "strata": {"model": {"n_layer": 4, "n_embd": 4096, "n_head": 32, "vocab_size": 50257, "max_seq_len": 2048},
	            "seq_len": 2048}}
	JSON
}

# part_cmd PART: the command of a part, one line (for --dry-run and run).
part_cmd() {
	case $1 in
	conformance) echo "$CUDA_TEST -test.v -test.count 1 -test.timeout $(($(limit_of conformance) - 10))s -test.run '^(TestProbe|TestConformance|TestDeterministic|TestMatchesCPUBackend|TestLlamaOpsMatchCPUBackend|TestAdamMatchesCPUAdam|TestKernelsCompile)\$'" ;;
	gpt2) echo "$STRATA_BIN bench step --backend $BACKEND --model gpt2 --batch 16 --seq 1024 --warmup 2 --steps 3 --block 1 --modes resident --hbm 100GiB --json" ;;
	torch) echo "$PYTHON $here/tools/torch_gpt2_step.py --model gpt2 --batch 16 --seq 1024 --warmup 2 --steps 3" ;;
	mfu) echo "$STRATA_BIN train --backend $BACKEND --config $OUT/mfu.json --steps 4 --no-progress --out $OUT/mfu" ;;
	offload) echo "$STRATA_BIN bench step --backend $BACKEND --model gpt2 --batch 4 --seq 1024 --warmup 1 --steps 2 --block 1 --modes resident,host,nvme --overlap exact,dpu --hbm 60GiB --nvme-path $NVME_PATH --json" ;;
	ranks) echo "env RANKS='2 4' RUNS=2 STEPS=8 RUN_TIMEOUT=15 HANG=0 CUDA_TEST=/nonexistent OUT=$OUT STRATA_BIN=$STRATA_BIN BACKEND=$BACKEND sh $root/gpu/cuda/device_check.sh multirank" ;;
	esac
}

# run_part PART: runs it under its limit; appends "PART rc SECONDS" to parts.txt.
run_part() {
	limit=$(limit_of "$1")
	start=$(date +%s)
	rc=0
	GOTRACEBACK=all timeout -s QUIT -k 15 "$limit" sh -c "exec $(part_cmd "$1")" >"$OUT/$1.log" 2>&1 || rc=$?
	echo "$1 $rc $(($(date +%s) - start))" >>"$OUT/parts.txt"
	echo "== $1: exit $rc in $(($(date +%s) - start)) s (limit $limit s)"
	[ "$rc" -eq 0 ] || tail -n 15 "$OUT/$1.log"
}

# json_num FILE KEY: the first number under "KEY": in FILE.
json_num() {
	sed -n "s/.*\"$2\": *\\([-0-9.eE+]*\\).*/\\1/p" "$1" 2>/dev/null | head -n 1
}

# runs_of FILE: bench step's "runs" in FILE, one a line: mode overlap
# step_s params_identical (the resident run's overlap is "-").
runs_of() {
	sed -n 's/.*"runs":\[\(.*\)\].*/\1/p' "$1" 2>/dev/null | head -n 1 | sed 's/},{/}@{/g' | tr '@' '\n' |
		sed -n 's/.*"mode":"\([a-z]*\)".*"overlap":"\([a-z]*\)".*"params_identical":\([a-z]*\).*"step_s":\([-0-9.eE+]*\).*/\1 o=\2 \4 \3/p' |
		awk '{ sub(/^o=/, "", $2); if ($2 == "") $2 = "-"; print }'
}

# step_of FILE MODE OVERLAP: that run's median step (empty when absent).
step_of() {
	runs_of "$1" | awk -v m="$2" -v o="$3" '$1 == m && $2 == o { print $3; exit }'
}

# status_of PART: ok, FAIL (exit N), TIMEOUT or "not run", from parts.txt.
status_of() {
	line=$(grep "^$1 " "$DIR/parts.txt" 2>/dev/null | tail -n 1)
	if [ -z "$line" ]; then
		echo "not run"
		return
	fi
	set -- $line
	case $2 in
	0) echo "ok ($3 s)" ;;
	124 | 137) echo "TIMEOUT after $3 s (goroutine dump in $1.log)" ;;
	*) echo "FAIL (exit $2, $3 s; see $1.log)" ;;
	esac
}

# summarize DIR: the summary of the parts' outputs in DIR, on stdout.
summarize() {
	DIR=$1
	peak=${PEAK_TFLOPS:-989}
	bad=0
	echo "cuda-verify summary ($DIR)"
	st=$(status_of conformance)
	pass=$(grep -c '^--- PASS' "$DIR/conformance.log" 2>/dev/null || true)
	fail=$(grep -c '^--- FAIL' "$DIR/conformance.log" 2>/dev/null || true)
	echo "conformance: $st; ${pass:-0} tests passed, ${fail:-0} failed"
	case $st in ok*) [ "${fail:-0}" -eq 0 ] || bad=1 ;; "not run") ;; *) bad=1 ;; esac
	gemm=$(sed -n 's/.*\(bf16 GEMMs: [^;]*\).*/\1/p' "$DIR/conformance.log" 2>/dev/null | head -n 1)
	echo "gemm path: ${gemm:-unknown (no TestProbe line)}"
	kc=$(sed -n 's/.*; \(kernel cache [^;]*\)$/\1/p' "$DIR/conformance.log" 2>/dev/null | head -n 1)
	echo "kernels: ${kc:-unknown (no TestProbe line)}"

	st=$(status_of gpt2)
	s=$(json_num "$DIR/gpt2.log" step_s_resident)
	st2=$(status_of torch)
	ts=$(json_num "$DIR/torch.log" torch_step_s_median)
	sdpa=$(sed -n 's/.*"sdpa": *\([a-z]*\).*/\1/p' "$DIR/torch.log" 2>/dev/null | head -n 1)
	tv=$(sed -n 's/.*"torch": *"\([^"]*\)".*/\1/p' "$DIR/torch.log" 2>/dev/null | head -n 1)
	echo "gpt2 step B=16 T=1024, strata: ${s:-?} s [$st]"
	echo "gpt2 step B=16 T=1024, torch ${tv:-?} bf16 autocast, sdpa ${sdpa:-?}: ${ts:-?} s [$st2]"
	if [ -n "$s" ] && [ -n "$ts" ]; then
		awk -v s="$s" -v t="$ts" 'BEGIN { r = s / t; printf "gpt2 strata/torch: %.2f (target <= 1.5: %s)\n", r, (r <= 1.5 ? "met" : "MISSED") }'
	else
		echo "gpt2 strata/torch: n/a"
	fi
	case $st in ok*) ;; "not run") ;; *) bad=1 ;; esac
	case $st2 in ok*) ;; "not run") ;; *) bad=1 ;; esac

	st=$(status_of mfu)
	med=""
	if [ -f "$DIR/mfu/steps.jsonl" ]; then
		med=$(sed -n 's/.*"step":\([0-9]*\),.*"step_s":\([-0-9.eE+]*\),.*/\1 \2/p' "$DIR/mfu/steps.jsonl" |
			awk '$1 > 1 { print $2 }' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
	fi
	params=$(json_num "$DIR/mfu/summary.json" params)
	if [ -n "$med" ] && [ -n "$params" ]; then
		# 6·N·tokens + 12·L·C·T·tokens, N without wpe (2048 x 4096); tokens 4 x 2048.
		awk -v s="$med" -v n="$params" -v peak="$peak" 'BEGIN {
			tok = 4 * 2048; f = 6 * (n - 2048 * 4096) * tok + 12 * 4 * 4096 * 2048 * tok
			tf = f / s / 1e12; m = 100 * tf / peak
			printf "gpt-7b shape, 4 layers, B=4 T=2048: step %.3f s (median of steps 2-4), %.1f TFLOP/s, MFU %.1f %% of %g (target >= 45 %%: %s)\n", s, tf, m, peak, (m >= 45 ? "met" : "MISSED") }'
	else
		echo "gpt-7b shape, 4 layers: n/a [$st]"
	fi
	case $st in ok*) ;; "not run") ;; *) bad=1 ;; esac

	st=$(status_of offload)
	# Bit-identity: the runs of the exact overlap (dpu's update is another
	# by design) and the resident run.
	n=$(runs_of "$DIR/offload.log" | awk '$2 != "dpu"' | wc -l | tr -d ' ')
	f=$(runs_of "$DIR/offload.log" | awk '$2 != "dpu" && $4 != "true"' | wc -l | tr -d ' ')
	if [ "$n" -gt 0 ] && [ "$f" -eq 0 ]; then
		echo "offload modes (resident, host, nvme): params bit-identical in $n of $n runs [$st]"
	elif [ "$n" -gt 0 ]; then
		echo "offload modes (resident, host, nvme): $f of $n runs DIFFER [$st]"
		bad=1
	else
		echo "offload modes: n/a [$st]"
	fi
	res=$(step_of "$DIR/offload.log" resident -)
	for o in exact dpu; do
		h=$(step_of "$DIR/offload.log" host $o)
		nv=$(step_of "$DIR/offload.log" nvme $o)
		if [ -n "$res" ] && [ -n "$h" ]; then
			awk -v r="$res" -v h="$h" -v n="${nv:-0}" -v o="$o" 'BEGIN {
				line = sprintf("host/resident step, %s overlap: %.3f (%.3f / %.3f s)", o, h / r, h, r)
				if (n > 0) line = line sprintf("; nvme/resident %.3f", n / r)
				if (o == "exact") line = line sprintf(" (target <= 1.10: %s)", (h / r <= 1.10 ? "met" : "MISSED"))
				print line }'
		else
			echo "host/resident step, $o overlap: n/a"
		fi
	done
	case $st in ok*) ;; "not run") ;; *) bad=1 ;; esac

	st=$(status_of ranks)
	lines=$(sed -n '/^== multirank summary/,$p' "$DIR/ranks.log" 2>/dev/null | sed '1d' | grep -E '^[0-9]+ ranks?[:,]|^1 rank' || true)
	if [ -n "$lines" ]; then
		echo "$lines" | sed 's/^/logical ranks: /'
	else
		echo "logical ranks: n/a [$st]"
	fi
	echo "logical ranks part: $st"
	case $st in ok*) ;; "not run") ;; *) bad=1 ;; esac
	if [ "$bad" -eq 0 ]; then echo "result: pass"; else echo "result: FAIL"; fi
	return $bad
}

parts=$all_parts
dry=0
case "$1" in
build)
	mkdir -p "$root/.cudabin"
	(cd "$root/gpu/cuda" && CGO_ENABLED=0 go test -c -o "$root/.cudabin/cuda.test" .)
	(cd "$root" && CGO_ENABLED=0 go build -o .cudabin/strata .)
	exit
	;;
summarize)
	[ -d "$2" ] || { echo "cuda-verify: summarize: no folder \"$2\"" >&2; usage; }
	summarize "$2"
	exit
	;;
esac
while [ $# -gt 0 ]; do
	case $1 in
	--parts)
		[ $# -ge 2 ] || { echo "cuda-verify: --parts needs a list" >&2; usage; }
		parts=$(echo "$2" | tr ',' ' ')
		for p in $parts; do
			case " $all_parts " in *" $p "*) ;; *) echo "cuda-verify: unknown part \"$p\"" >&2; usage ;; esac
		done
		shift 2
		;;
	--dry-run) dry=1; shift ;;
	-h | --help) usage ;;
	*) echo "cuda-verify: unexpected argument \"$1\"" >&2; usage ;;
	esac
done
: "${OUT:=/tmp/cuda-verify}" "${STRATA_BIN:=$root/.cudabin/strata}" "${CUDA_TEST:=$root/.cudabin/cuda.test}"
: "${PYTHON:=python3}" "${NVME_PATH:=/tmp}" "${BACKEND:=cuda}"
total=0
for p in $parts; do total=$((total + $(limit_of "$p"))); done
if [ "$dry" -eq 1 ]; then
	for p in $parts; do echo "$p [$(limit_of "$p") s]: $(part_cmd "$p")"; done
	echo "total limit: $total s"
	exit 0
fi
for b in "$STRATA_BIN" "$CUDA_TEST"; do
	[ -x "$b" ] || { echo "cuda-verify: no $b: run \"sh bench/cuda-verify.sh build\" where Go is, and carry .cudabin" >&2; exit 1; }
done
mkdir -p "$OUT"
rm -rf "$OUT/mfu" "$OUT/parts.txt"
mfu_config >"$OUT/mfu.json"
echo "cuda-verify: parts $parts, $total s of limits; logs in $OUT"
for p in $parts; do run_part "$p"; done
rc=0
summarize "$OUT" >"$OUT/summary.txt" || rc=$?
echo "=="
cat "$OUT/summary.txt"
exit $rc
