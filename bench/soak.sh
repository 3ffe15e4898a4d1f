#!/usr/bin/env bash
# An NVMe soak: a stage-3 run of the small model on 2 CPU devices with its
# params and optimizer state on NVMe trains STEPS steps, while its resident
# memory (VmRSS), OS threads (Threads in /proc/PID/status), open files
# (/proc/PID/fd) and goroutines (steps.jsonl's "goroutines", written with
# each step) are sampled every INTERVAL seconds. It prints them at the
# first step, the middle one, the last one and their maximum: each must be
# flat (a leak grows with the steps).
#
#   bench/soak.sh [STEPS] [DIR] [INTERVAL]   (default 1000, a fresh directory under /tmp, 2 s)
set -euo pipefail
steps=${1:-1000}
dir=${2:-$(mktemp -d /tmp/strata-soak.XXXXXX)}
interval=${3:-2}
cd "$(dirname "$0")/.."
mkdir -p "$dir/swap"
go build -o "$dir/strata" .
# The run: `small`, ZeRO-3 on 2 CPU devices, params and optimizer state on NVMe under $dir/swap.
sed "s|@SWAP@|$dir/swap|g" bench/small-nvme.json.in > "$dir/cfg.json"
"$dir/strata" train --config "$dir/cfg.json" --steps "$steps" --no-progress --out "$dir/run" > "$dir/train.log" 2>&1 &
pid=$!
samples=$dir/samples.tsv
printf 'elapsed_s\tstep\trss_kib\tthreads\tfds\tgoroutines\n' > "$samples"
t0=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
  status=$(cat "/proc/$pid/status" 2>/dev/null) || break
  rss=$(awk '/^VmRSS:/ { print $2 }' <<< "$status")
  threads=$(awk '/^Threads:/ { print $2 }' <<< "$status")
  fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
  last=$(tail -n 1 "$dir/run/steps.jsonl" 2>/dev/null || true)
  step=$(sed -n 's/^{"step":\([0-9]*\),.*/\1/p' <<< "$last")
  gor=$(sed -n 's/.*"goroutines":\([0-9]*\).*/\1/p' <<< "$last")
  if [ -n "$step" ] && [ -n "$rss" ]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(($(date +%s) - t0))" "$step" "$rss" "$threads" "$fds" "$gor" >> "$samples"
  fi
  sleep "$interval"
done
wait "$pid"
tail -n 3 "$dir/train.log"
echo "swap files left in $dir/swap: $(ls "$dir/swap" | wc -l)"
awk -F'\t' -v steps="$steps" '
  NR == 1 { next }
  { n++; for (i = 1; i <= 6; i++) v[n, i] = $i
    if (mid == 0 || ($2 - steps / 2) ^ 2 < (v[mid, 2] - steps / 2) ^ 2) mid = n
    for (i = 3; i <= 6; i++) if ($i > mx[i]) mx[i] = $i }
  END {
    split("elapsed_s step rss_kib threads fds goroutines", name, " ")
    printf "%d samples\n| | step | RSS (MiB) | threads | open files | goroutines |\n|---|---|---|---|---|---|\n", n
    split("start middle end", label, " "); row[1] = 1; row[2] = mid; row[3] = n
    for (r = 1; r <= 3; r++) { k = row[r]
      printf "| %s | %d | %.1f | %d | %d | %d |\n", label[r], v[k, 2], v[k, 3] / 1024, v[k, 4], v[k, 5], v[k, 6] }
    printf "| max | | %.1f | %d | %d | %d |\n", mx[3] / 1024, mx[4], mx[5], mx[6]
  }' "$samples"
