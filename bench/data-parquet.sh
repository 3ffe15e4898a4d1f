#!/usr/bin/env bash
# Parquet against JSONL (issue 43): the same chat examples as one Parquet
# file of about 2 GiB (zstd, dictionary, 8,192 rows a row group, written by
# data/testdata/npm/big.mjs, an independent writer) and as JSONL (about
# 4.9 GB), each trained 3 steps by `strata train --data` in its own
# process: the peak RSS (/usr/bin/time -v) and the tokenization rate
# (tokens over the "tokenized in" time strata prints). The byte-level
# tokenizer, so that the reader's share of the time is as large as it gets.
# The runs alternate, ROUNDS (3) of each; it prints the medians and the
# ratios Parquet/JSONL. Files in DIR (default /var/tmp/strata-parquet,
# kept between runs; ROWS rows, default 2,300,000: about 8 minutes to write).
#
#   bench/data-parquet.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
dir=${1:-/var/tmp/strata-parquet}
rows=${ROWS:-2300000}
rounds=${ROUNDS:-3}
mkdir -p "$dir"
go build -o "$dir/strata" .
if [ ! -s "$dir/big.parquet" ] || [ ! -s "$dir/big.jsonl" ]; then
  echo "writing $rows examples as Parquet and JSONL in $dir ($(date +%T))"
  node data/testdata/npm/big.mjs "$dir/big.parquet" "$dir/big.jsonl" "$rows"
fi
cat > "$dir/config.json" <<'EOF'
{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "small", "devices": 2, "seq_len": 128, "seed": 5}
}
EOF
ls -l "$dir/big.parquet" "$dir/big.jsonl"
# one FORMAT: trains on big.FORMAT; prints "rss_kib tokens seconds".
one() {
  local log=$dir/run-$1.log
  /usr/bin/time -v "$dir/strata" train --config "$dir/config.json" --data "$dir/big.$1" --steps 3 --no-progress --out "$dir/out-$1" >"$log" 2>&1 \
    || { cat "$log" >&2; exit 1; }
  rm -rf "$dir/out-$1"
  local rss tokens secs
  rss=$(awk '/Maximum resident set size/ {print $NF}' "$log")
  tokens=$(sed -n 's/^data: .*, \([0-9]*\) tokens of which.*/\1/p' "$log")
  # Go's duration: 1m40.123s, 12.345s or 850ms.
  secs=$(sed -n 's/^data: .*tokenized in \([0-9hms.]*\).*/\1/p' "$log" | awk '{
    d = $1; t = 0
    if (d ~ /ms$/) { sub(/ms$/, "", d); print d / 1000; exit }
    if (d ~ /h/) { split(d, a, "h"); t += a[1] * 3600; d = a[2] }
    if (d ~ /m/) { split(d, a, "m"); t += a[1] * 60; d = a[2] }
    sub(/s$/, "", d); print t + d }')
  grep '^data: ' "$log" | head -1 >&2
  echo "$rss $tokens $secs"
}
declare -a pq js
for r in $(seq "$rounds"); do
  js+=("$(one jsonl)"); echo "round $r jsonl:   ${js[-1]}"
  pq+=("$(one parquet)"); echo "round $r parquet: ${pq[-1]}"
done
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
col() { local -n arr=$1; for x in "${arr[@]}"; do echo "$x" | awk -v c="$2" '{print (c==0) ? $1 : $2/$3}'; done | median; }
pr=$(col pq 0); jr=$(col js 0); pt=$(col pq 1); jt=$(col js 1)
awk -v pr="$pr" -v jr="$jr" -v pt="$pt" -v jt="$jt" 'BEGIN {
  printf "peak RSS:          parquet %.0f MiB, jsonl %.0f MiB: parquet/jsonl %.3f\n", pr/1024, jr/1024, pr/jr
  printf "tokenization rate: parquet %.2f M tokens/s, jsonl %.2f M tokens/s: jsonl/parquet %.3f\n", pt/1e6, jt/1e6, jt/pt }'
