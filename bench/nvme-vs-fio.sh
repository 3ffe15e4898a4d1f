#!/usr/bin/env bash
# Side by side: Strata's NVMe engine (io_uring and pread) against fio
# (--ioengine=io_uring --direct=1, ../shared/tools/fio-anchor.sh) on the same
# file, size, block size and queue depth. Runs alternate (the order rotates
# every round) and the table shows the median MB/s of each and the ratios.
#
# Usage: [STRATA_BIN=path] bench/nvme-vs-fio.sh [FILE] [SIZE_MIB] [ROUNDS]
#   defaults: /var/tmp/strata-nvme-vs-fio.dat 2048 5
# Needs fio (apt-get install -y fio), python3 and Go. MB = 10^6 bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-/var/tmp/strata-nvme-vs-fio.dat}
size=${2:-2048}
rounds=${3:-5}
anchor=${FIO_ANCHOR:-$(cd .. && pwd)/shared/tools/fio-anchor.sh}
[ -x "$anchor" ] || anchor=/work/shared/tools/fio-anchor.sh
command -v fio >/dev/null || { echo "nvme-vs-fio: fio is not installed (apt-get install -y fio)" >&2; exit 2; }
export PATH=/usr/local/go/bin:$PATH
# STRATA_BIN: a prebuilt strata binary (else it is built from this checkout).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${STRATA_BIN:-$tmp/strata}
[ -n "${STRATA_BIN:-}" ] || go build -o "$bin" .
out=$tmp/runs.txt

# The read cells come first: fio-anchor writes the file once if it is missing.
cells=("read 1M 32" "read 128K 32" "write 1M 32" "write 128K 32")
tools=(fio uring pread)
echo "file $file, ${size} MiB, $rounds rounds; fio: $(fio --version)" >&2
for ((round = 0; round < rounds; round++)); do
  for cell in "${cells[@]}"; do
    read -r rw bs qd <<<"$cell"
    for ((k = 0; k < ${#tools[@]}; k++)); do
      tool=${tools[$(((k + round) % ${#tools[@]}))]}
      if [ "$tool" = fio ]; then
        mbps=$("$anchor" "$file" "$size" "$rw" "$bs" "$qd" | python3 -c 'import json,sys; print(json.load(sys.stdin)["mbps"])')
      else
        mbps=$("$bin" bench nvme --quiet --json --path "$file" --size "${size}M" --rw "$rw" --bs "$bs" --qd "$qd" --engine "$tool" |
          python3 -c 'import json,sys; print(round(json.load(sys.stdin)["mbps"], 1))')
      fi
      echo "$rw $bs $qd $tool $mbps" | tee -a "$out" >&2
    done
  done
done

python3 - "$out" "$size" "$rounds" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    rw, bs, qd, tool, mbps = line.split()
    rows[(rw, bs, qd, tool)].append(float(mbps))
print(f"\nmedian MB/s (1 MB = 10^6 B) of {sys.argv[3]} alternating rounds, {sys.argv[2]} MiB file, O_DIRECT")
print("| rw | bs | qd | fio io_uring | strata uring | strata pread | uring / fio | pread / fio |")
print("|---|---|---|---:|---:|---:|---:|---:|")
seen = []
for (rw, bs, qd, _) in rows:
    if (rw, bs, qd) not in seen:
        seen.append((rw, bs, qd))
for rw, bs, qd in seen:
    m = {t: statistics.median(rows[(rw, bs, qd, t)]) for t in ("fio", "uring", "pread")}
    print(f"| {rw} | {bs} | {qd} | {m['fio']:.0f} | {m['uring']:.0f} | {m['pread']:.0f} | {m['uring']/m['fio']:.3f} | {m['pread']/m['fio']:.3f} |")
PY
