#!/usr/bin/env bash
# CPU Adam against the memory roofline of bench/tools/membw.sh, measured alternately.
#
# For PARAMS parameters (default 100M), each round runs membw.sh (r4w3: read 4 fp32 arrays,
# write 3, 28 B/elem; OpenMP C, -O3 -march=native; arrays of PARAMS floats; 1 and 2 threads)
# and then `strata bench adam --isa auto --json` (the best ISA this CPU has: avx512, avx2 or go; ISA= to force one) with 1 and 2 threads for three variants:
# fp32 grads (28 B/param), bf16 grads (26 B/param), fp32 grads + bf16 out (30 B/param).
# The machine is shared and noisy, so the rounds alternate and medians are quoted:
# membw's per-run median r4w3, bench adam's per-run median step, then the median over rounds;
# also the median of per-round ratios (each adam run against the membw run just before it).
#
# Usage: bench/adam-vs-membw.sh [rounds, default 5] [params, default 100000000]
#   STRATA=/path/to/strata uses a prebuilt binary instead of `go build`.
# Needs, from a fresh clone: Go (unless STRATA) and a C compiler with OpenMP (apt-get install -y gcc).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
params=${2:-100000000}
isa=${ISA:-auto}
membw=bench/tools/membw.sh
mib=$(( (params * 4 + 1048575) / 1048576 ))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
strata=${STRATA:-}
if [ -z "$strata" ]; then
  strata=$tmp/strata
  command -v go >/dev/null || { echo "adam-vs-membw: go is not on PATH (https://go.dev/dl), or give STRATA" >&2; exit 2; }
  go build -o "$strata" .
fi

# field FILE KEY: the numeric values of "KEY" in a file of JSON lines.
field() { grep -o "\"$2\": *[0-9.e+-]*" "$1" | sed 's/.*: *//'; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

variants=("fp32::28" "bf16::26" "fp32:--bf16-out:30")
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds: membw.sh $mib MiB/array" >&2
  "$membw" "$mib" 7 > "$tmp/membw.out"
  grep '"threads": 1,' "$tmp/membw.out" >> "$tmp/membw1.jsonl"
  grep '"threads": 2,' "$tmp/membw.out" >> "$tmp/membw2.jsonl"
  for v in "${variants[@]}"; do
    IFS=: read -r grad extra bytes <<< "$v"
    for t in 1 2; do
      echo "round $r/$rounds: strata bench adam --threads $t --grad $grad $extra" >&2
      # shellcheck disable=SC2086
      "$strata" bench adam --isa "$isa" --threads "$t" --params "$params" --grad "$grad" $extra --rounds 5 --json \
        >> "$tmp/adam-$grad$extra-$t.jsonl"
    done
  done
done

used=$(grep -oh '"isa": *"[a-z0-9]*"' "$tmp"/adam-*.jsonl | sed 's/.*"\([a-z0-9]*\)"$/\1/' | sort -u | tr '\n' ' ')
printf '\nparams=%d rounds=%d isa=%s, run as: %s(GB/s, 1 GB = 1e9 B; medians over rounds)\n' "$params" "$rounds" "$isa" "$used"
printf 'adam/membw: ratio of the medians; paired: median over rounds of (adam / membw of the same round);\n'
printf 'adam/inproc: median of bench adam'"'"'s own ratio to the r4w3 pass alternated with each step.\n'
printf '%-22s %7s %7s %9s %10s %10s %10s %11s\n' variant threads B/param adam_GBps membw_r4w3 adam/membw paired adam/inproc
for v in "${variants[@]}"; do
  IFS=: read -r grad extra bytes <<< "$v"
  for t in 1 2; do
    f=$tmp/adam-$grad$extra-$t.jsonl
    a=$(field "$f" gbps | median)
    in=$(field "$f" ratio_to_roofline | median)
    m=$(field "$tmp/membw$t.jsonl" r4w3_gbps_median | median)
    paired=$(paste <(field "$f" gbps) <(field "$tmp/membw$t.jsonl" r4w3_gbps_median) | awk '{print $1/$2}' | median)
    awk -v n="grad=$grad $extra" -v t="$t" -v b="$bytes" -v a="$a" -v m="$m" -v i="$in" -v p="$paired" \
      'BEGIN {printf "%-22s %7d %7d %9.2f %10.2f %10.3f %10.3f %11.3f\n", n, t, b, a, m, a/m, p, i}'
  done
done
printf '\nall rounds, membw r4w3 median per run (t=1): %s\n' "$(field "$tmp/membw1.jsonl" r4w3_gbps_median | tr '\n' ' ')"
printf 'all rounds, membw r4w3 median per run (t=2): %s\n' "$(field "$tmp/membw2.jsonl" r4w3_gbps_median | tr '\n' ' ')"
printf 'all rounds, adam fp32 GB/s (t=1): %s\n' "$(field "$tmp/adam-fp32-1.jsonl" gbps | awk '{printf "%.2f ", $1}')"
printf 'all rounds, adam fp32 GB/s (t=2): %s\n' "$(field "$tmp/adam-fp32-2.jsonl" gbps | awk '{printf "%.2f ", $1}')"
