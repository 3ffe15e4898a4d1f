#!/usr/bin/env bash
# Build (once per source change) and run the memory-bandwidth roofline (membw.c beside this script);
# prints one JSON line per thread count (1 and all cores).
# Usage: bench/tools/membw.sh [MiB per array] [reps]      e.g. bench/tools/membw.sh 512 10
# Needs a C compiler with OpenMP: apt-get install -y gcc (CC=clang also works, with libomp-dev).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "membw.sh: no C compiler ($cc): apt-get install -y gcc" >&2; exit 2; }
bin=${TMPDIR:-/tmp}/strata-membw-$(id -u)
if [ ! -x "$bin" ] || [ "$here/membw.c" -nt "$bin" ]; then
  "$cc" -O3 -march=native -fopenmp -o "$bin" "$here/membw.c" ||
    { echo "membw.sh: $cc could not build membw.c with OpenMP (apt-get install -y gcc)" >&2; exit 2; }
fi
for t in 1 $(nproc); do
  OMP_NUM_THREADS=$t OMP_PROC_BIND=close "$bin" "${1:-512}" "${2:-10}"
done | awk '!seen[$0]++'
