#!/usr/bin/env bash
# Side by side: Strata's NVMe engine (io_uring, and pread with TOOLS="fio uring pread") against fio
# (--ioengine=io_uring --direct=1 --mem=shmhuge: huge-page buffers, fio's best case; bench/tools/fio-anchor.sh)
# on the same file, size, block size and queue depth. Runs alternate (the order rotates every round) and
# the table shows the median MB/s of each, the ratios, and each side's block-layer requests: how many
# reached the disk per GiB and their average size (/sys/block/<dev>/stat deltas), so a split shows.
#
# Usage: [STRATA_BIN=path] [TOOLS="fio uring"] [HUGETLB=0] bench/nvme-vs-fio.sh [FILE] [SIZE_MIB] [ROUNDS]
#   defaults: /var/tmp/strata-nvme-vs-fio.dat 2048 7. FILE is created by the first read cell if missing,
#   and the write cells overwrite it (strata with --force): give a file of this bench's own.
#   TOOLS: fio, uring, pread, and uring-bN: io_uring with --submit-batch N (N requests per io_uring_enter, which
#   lets the block layer merge adjacent ones; the default, uring, hands each request over on its own as fio does).
#   Where THP is `never`, Strata's buffers need hugetlb pages (fio-anchor reserves its own per run): as root the
#   script reserves them for the whole run and restores vm.nr_hugepages at exit; HUGETLB=0 leaves them out, to see
#   what Strata does in 4 KiB pages.
# Needs, from a fresh clone: Go (to build strata, unless STRATA_BIN), fio and python3
# (apt-get update && apt-get install -y fio python3). Root lets fio reserve huge pages. MB = 10^6 bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-/var/tmp/strata-nvme-vs-fio.dat}
size=${2:-2048}
rounds=${3:-7}
anchor=bench/tools/fio-anchor.sh
read -r -a tools <<<"${TOOLS:-fio uring pread}"
command -v fio >/dev/null || { echo "nvme-vs-fio: fio is not installed (apt-get update && apt-get install -y fio)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "nvme-vs-fio: python3 is not installed (apt-get install -y python3)" >&2; exit 2; }
tmp=$(mktemp -d)
hugetlb_restore=""
trap 'rm -rf "$tmp"; [ -z "$hugetlb_restore" ] || echo "$hugetlb_restore" >/proc/sys/vm/nr_hugepages' EXIT
bin=${STRATA_BIN:-$tmp/strata}
if [ -z "${STRATA_BIN:-}" ]; then
  command -v go >/dev/null || { echo "nvme-vs-fio: go is not on PATH (https://go.dev/dl), or give STRATA_BIN" >&2; exit 2; }
  go build -o "$bin" .
fi
out=$tmp/runs.txt
thp=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)
if [ "$thp" = never ] && [ "${HUGETLB:-1}" != 0 ]; then
  # Strata's largest buffer set: 1 MiB x 32 = 16 huge pages; fio-anchor adds what fio needs on top per run.
  have=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
  if [ "$have" -lt 16 ] && echo 16 >/proc/sys/vm/nr_hugepages 2>/dev/null && [ "$(cat /proc/sys/vm/nr_hugepages)" -ge 16 ]; then
    hugetlb_restore=$have
    echo "THP never: 16 hugetlb pages reserved for Strata's buffers (vm.nr_hugepages $have -> 16, restored at exit)" >&2
  elif [ "$have" -lt 16 ]; then
    echo "THP never and no hugetlb pages could be reserved: Strata's buffers are in 4 KiB pages (fio's too, if not root)" >&2
  fi
fi

# The read cells come first: fio-anchor writes the file once if it is missing.
cells=("read 1M 32" "read 128K 32" "write 1M 32" "write 128K 32")
echo "file $file, ${size} MiB, $rounds rounds, THP $thp; $(fio --version)" >&2
for ((round = 0; round < rounds; round++)); do
  for cell in "${cells[@]}"; do
    read -r rw bs qd <<<"$cell"
    for ((k = 0; k < ${#tools[@]}; k++)); do
      tool=${tools[$(((k + round) % ${#tools[@]}))]}
      if [ "$tool" = fio ]; then
        # A run can fail on a shared machine (another process changed vm.nr_hugepages under fio): one more try,
        # then the script stops.
        json=$("$anchor" "$file" "$size" "$rw" "$bs" "$qd") ||
          { echo "nvme-vs-fio: fio-anchor $rw $bs failed (exit $?); once more" >&2; json=$("$anchor" "$file" "$size" "$rw" "$bs" "$qd"); }
        line=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1])
print(j["mbps"], j["block_requests"] or 0, (j["block_avg_kib"] or 0), j["mem"])' "$json")
      else
        engine=${tool%%-b*} batch=1
        [ "$engine" = "$tool" ] || batch=${tool##*-b}
        line=$("$bin" bench nvme --quiet --json --force --path "$file" --size "${size}M" --rw "$rw" --bs "$bs" --qd "$qd" \
          --engine "$engine" --submit-batch "$batch" |
          python3 -c 'import json,sys; j=json.load(sys.stdin)
mem = "4k" if j["huge_page_bytes"] < j["buffer_bytes"] else "hugetlb" if "hugetlb" in j["buffers"] else "huge"
print(round(j["mbps"], 1), j["block_requests"], round(j["block_avg_bytes"]/1024), mem)')
      fi
      echo "$rw $bs $qd $tool $line" | tee -a "$out" >&2
    done
  done
done

python3 - "$out" "$size" "$rounds" "$thp" "${tools[*]}" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    rw, bs, qd, tool, mbps, reqs, avg, mem = line.split()
    rows[(rw, bs, qd, tool)].append((float(mbps), int(reqs), int(avg), mem))
size_mib, tools = int(sys.argv[2]), sys.argv[5].split()
print(f"\nmedian MB/s (1 MB = 10^6 B) of {sys.argv[3]} alternating rounds, {size_mib} MiB file, O_DIRECT, THP {sys.argv[4]};")
print("block: the median of the block layer's requests per GiB and their average size in KiB (whole device)")
print("won: the rounds in which the tool was faster than fio in the same round")
others = [t for t in tools if t != "fio"]
hdr = (["rw", "bs", "qd"] + [f"{t} MB/s" for t in tools] + [f"{t} / fio" for t in others] + [f"{t} won" for t in others] +
       [f"{t} block req/GiB @ KiB" for t in tools])
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * 3 + "---:|" * (len(hdr) - 3))
seen = []
for (rw, bs, qd, _) in rows:
    if (rw, bs, qd) not in seen:
        seen.append((rw, bs, qd))
for rw, bs, qd in seen:
    m = {t: statistics.median(r[0] for r in rows[(rw, bs, qd, t)]) for t in tools}
    blk = {t: (statistics.median(r[1] for r in rows[(rw, bs, qd, t)]) * 1024 / size_mib,
               statistics.median(r[2] for r in rows[(rw, bs, qd, t)]),
               "/".join(sorted(set(r[3] for r in rows[(rw, bs, qd, t)])))) for t in tools}
    fio = [r[0] for r in rows[(rw, bs, qd, "fio")]]
    won = {t: sum(a[0] > b for a, b in zip(rows[(rw, bs, qd, t)], fio)) for t in others}
    cells = [rw, bs, qd] + [f"{m[t]:.0f}" for t in tools] + [f"{m[t]/m['fio']:.3f}" for t in others]
    cells += [f"{won[t]}/{len(fio)}" for t in others]
    cells += [f"{blk[t][0]:.0f} @ {blk[t][1]:.0f} ({blk[t][2]})" for t in tools]
    print("| " + " | ".join(cells) + " |")
PY
