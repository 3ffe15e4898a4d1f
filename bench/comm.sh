#!/usr/bin/env bash
# The cross-process all-reduce against MPI's own, side by side (issue 28):
#   bench/comm.sh [BYTES] [PAIRS] [PROCS]      (default 64MiB 7 2)
# Builds bench/comm/allreduce.c with mpicc, then runs PAIRS alternating
# pairs of jobs on this machine (loopback): `mpirun -np PROCS strata bench
# comm --size BYTES` (the cpu backend's AllReduce in rank order, which also
# times MPI_Allreduce through the same library in the same job) and the C
# program's MPI_Allreduce of the same bytes; prints each pair and the
# medians of the pairs, bus bandwidth 2(N-1)/N × bytes / time.
# Needs Open MPI (apt-get install openmpi-bin libopenmpi-dev) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-64MiB}
pairs=${2:-7}
np=${3:-2}
export PATH=/usr/local/go/bin:$PATH GOFLAGS=-mod=mod
# A container's root: Open MPI refuses root unless told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/strata" .
mpicc -O2 -o "$tmp/allreduce" bench/comm/allreduce.c
bytes=$(python3 -c "
import re,sys
s=sys.argv[1]; m=re.fullmatch(r'(\d+)\s*([KMG]i?B)?',s)
k={'KiB':1<<10,'MiB':1<<20,'GiB':1<<30,'KB':1000,'MB':10**6,'GB':10**9,None:1}[m.group(2)]
print(int(m.group(1))*k)" "$size")
run="mpirun -np $np --oversubscribe --bind-to none"
: > "$tmp/pairs"
for i in $(seq "$pairs"); do
  s=$($run "$tmp/strata" bench comm --size "$bytes" --rounds 5 --json)
  c=$($run "$tmp/allreduce" "$bytes" 5)
  python3 - "$s" "$c" "$i" >> "$tmp/pairs" <<'PY'
import json, sys
s, c, i = json.loads(sys.argv[1]), sys.argv[2].split(), sys.argv[3]
print(f"{i} {s['strata_median_s']:.6f} {s['mpi_median_s']:.6f} {float(c[3]):.6f} {s['processes']} {s['bytes']}")
PY
  tail -1 "$tmp/pairs"
done
python3 - "$tmp/pairs" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
st = statistics.median(float(r[1]) for r in rows)
go = statistics.median(float(r[2]) for r in rows)
c = statistics.median(float(r[3]) for r in rows)
n, b = int(rows[0][4]), int(rows[0][5])
bus = lambda t: 2 * (n - 1) / n * b / t / 2**30
print(f"all-reduce of {b} bytes, {n} processes, medians of {len(rows)} pairs:")
print(f"  strata cpu backend (rank order)   {1e3*st:8.2f} ms  bus {bus(st):.2f} GiB/s")
print(f"  MPI_Allreduce from strata's job   {1e3*go:8.2f} ms  bus {bus(go):.2f} GiB/s")
print(f"  MPI_Allreduce, C program          {1e3*c:8.2f} ms  bus {bus(c):.2f} GiB/s")
print(f"  ratio strata / C program: {c/st:.3f}")
PY
