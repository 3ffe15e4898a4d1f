#!/usr/bin/env bash
# The I/O anchor: what fio with io_uring and O_DIRECT gets on a file, for one block size and depth, with its buffers in
# huge pages (--mem=shmhuge). On a virtio or NVMe queue with max_segments below a block's page count, 4 KiB-page buffers
# make the kernel split every large request (a 1 MiB read of scattered pages becomes two 512 KiB requests), and a disk
# bounded by requests per second then looks several times slower than it is; huge-page buffers are fio's best case.
# Prints one JSON line: {"rw":..., "bs":..., "iodepth":..., "mbps":..., "iops":..., "clat_p50_us":..., "clat_p99_us":...,
#   "mem":..., "block_requests":..., "block_avg_kib":...}
# Usage: fio-anchor.sh FILE SIZE_MIB read|write BS IODEPTH [MEM]   e.g. fio-anchor.sh /var/tmp/f 2048 read 1M 32
#   MEM: shmhuge (default; reserves huge pages for the run when it may, as root) or malloc (fio's default).
# Needs fio (apt-get install -y fio), python3, numfmt and lsblk (coreutils, util-linux). MB = 1e6 bytes.
# Part of Strata: bench/nvme-vs-fio.sh runs it against `strata bench nvme`.
set -euo pipefail
file=$1 size=$2 rw=$3 bs=$4 qd=$5 mem=${6:-shmhuge}
command -v fio >/dev/null || { echo "fio-anchor: fio is not installed (apt-get install -y fio)" >&2; exit 2; }
if [ "$rw" = read ] && [ ! -f "$file" ]; then
  fio --name=prep --filename="$file" --size="${size}M" --rw=write --bs=1M --iodepth=16 \
      --ioengine=io_uring --direct=1 --output=/dev/null
fi
restore=""
if [ "$mem" = shmhuge ]; then
  bs_bytes=$(numfmt --from=iec "$bs"); need=$(( (bs_bytes * qd + 2097151) / 2097152 + 8 ))
  have=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
  if [ "$have" -lt "$need" ]; then
    if echo "$need" >/proc/sys/vm/nr_hugepages 2>/dev/null && [ "$(cat /proc/sys/vm/nr_hugepages)" -ge "$need" ]; then restore=$have
    else [ -n "$restore" ] || echo "$have" >/proc/sys/vm/nr_hugepages 2>/dev/null || true; mem=malloc; echo "fio-anchor: no huge pages to be had; using malloc buffers" >&2; fi
  fi
fi
trap '[ -n "$restore" ] && echo "$restore" >/proc/sys/vm/nr_hugepages 2>/dev/null || true' EXIT
dev=$(lsblk -no PKNAME "$(df --output=source "$(dirname "$(readlink -f "$file")")" | tail -1)" 2>/dev/null | head -1)
[ -n "$dev" ] && [ -r "/sys/block/$dev/stat" ] || dev=$(basename "$(df --output=source "$(dirname "$(readlink -f "$file")")" | tail -1)")
before=$(cat "/sys/block/$dev/stat" 2>/dev/null || echo "0 0 0 0 0 0 0 0")
out=$(fio --name=anchor --filename="$file" --size="${size}M" --rw="$rw" --bs="$bs" --iodepth="$qd" \
    --ioengine=io_uring --direct=1 --numjobs=1 --mem="$mem" --output-format=json 2>/dev/null)
after=$(cat "/sys/block/$dev/stat" 2>/dev/null || echo "0 0 0 0 0 0 0 0")
python3 -c '
import json,sys
j=json.loads(sys.argv[6])["jobs"][0]; rw=sys.argv[1]; s=j["read" if rw=="read" else "write"]
p=s.get("clat_ns",{}).get("percentile",{})
b=list(map(int,sys.argv[4].split())); a=list(map(int,sys.argv[5].split())); k=0 if rw=="read" else 4
reqs=a[k]-b[k]; sect=a[k+2]-b[k+2]
print(json.dumps({"rw":rw,"bs":sys.argv[2],"iodepth":int(sys.argv[3]),"mbps":round(s["bw_bytes"]/1e6,1),
 "iops":round(s["iops"]),"clat_p50_us":round(p.get("50.000000",0)/1e3,1),"clat_p99_us":round(p.get("99.000000",0)/1e3,1),
 "mem":sys.argv[7],"block_requests":reqs,"block_avg_kib":round(sect*512/1024/reqs) if reqs else None}))
' "$rw" "$bs" "$qd" "$before" "$after" "$out" "$mem"
