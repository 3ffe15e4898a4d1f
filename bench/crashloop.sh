#!/usr/bin/env bash
# A crash loop: a stage-3 run with params and optimizer state on NVMe is
# killed (SIGKILL) at random moments KILLS times, resumed after each kill
# from its latest checkpoint, then run to the end; its final weights must be
# byte-identical to an uninterrupted run's, and no swap file may be left on
# the swap path (each start reclaims the files of killed runs).
#
#   bench/crashloop.sh [KILLS] [DIR]      (default 15, a fresh directory under /var/tmp)
set -euo pipefail
kills=${1:-15}
dir=${2:-$(mktemp -d /var/tmp/strata-crashloop.XXXXXX)}
cd "$(dirname "$0")/.."
go build -o "$dir/strata" .
strata=$dir/strata
mkdir -p "$dir/swap"
# The run: `small`, ZeRO-3 on 2 CPU devices, params and optimizer state on NVMe under $dir/swap.
sed "s|@SWAP@|$dir/swap|g" bench/small-nvme.json.in > "$dir/cfg.json"
steps=40
args=(--config "$dir/cfg.json" --steps $steps --save-every 2 --keep 2)
echo "uninterrupted run"
"$strata" train "${args[@]}" --out "$dir/ref" > "$dir/ref.log" 2>&1
for i in $(seq 1 "$kills"); do
  if [ -e "$dir/run/checkpoints/latest" ]; then
    "$strata" train --resume "$dir/run" --out "$dir/run" --steps $steps --save-every 2 --keep 2 > "$dir/run-$i.log" 2>&1 &
  else
    rm -rf "$dir/run"
    "$strata" train "${args[@]}" --out "$dir/run" > "$dir/run-$i.log" 2>&1 &
  fi
  pid=$!
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.5 + 4 * rand() }')"
  if kill -9 "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null || true
    echo "kill $i: SIGKILL at $(cat "$dir/run/checkpoints/latest" 2>/dev/null || echo 'no checkpoint yet'); swap files left: $(ls "$dir/swap" | wc -l)"
  else
    wait "$pid" || true
    echo "kill $i: the run had ended"
    break
  fi
done
echo "final run"
if [ -e "$dir/run/checkpoints/latest" ]; then
  "$strata" train --resume "$dir/run" --out "$dir/run" --steps $steps --save-every 2 --keep 2 > "$dir/final.log" 2>&1
else
  rm -rf "$dir/run"
  "$strata" train "${args[@]}" --out "$dir/run" > "$dir/final.log" 2>&1
fi
grep -h "reclaimed" "$dir"/run-*.log "$dir/final.log" | sed 's/^/  /' || true
left=$(ls "$dir/swap" | wc -l)
if cmp -s "$dir/ref/model.safetensors" "$dir/run/model.safetensors"; then same=yes; else same=no; fi
echo "final weights identical to the uninterrupted run: $same; swap files left: $left"
[ "$same" = yes ] && [ "$left" = 0 ]
