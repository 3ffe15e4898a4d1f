#!/usr/bin/env bash
# The parity check of narrow optimizer state (strata.optimizer_state.moments):
# the same run, seed and data with fp32, bf16 and int8 moments — the
# `medium` model on real text (this repository's documentation, byte-level),
# ZeRO stage 3, optimizer state on NVMe — and each narrow run's loss curve and
# final weights against the fp32 run's; and the fp32 run again with the master
# kept as the bf16 param plus a remainder (strata.optimizer_state.master
# "bf16+remainder"), which must be bit-identical to it.
#
#   bench/moments-parity.sh [STEPS] [DIR]     (default 200 steps, a temp dir)
#
# Prints the loss every STEPS/10 steps side by side, the final loss and its
# relative difference to fp32's, the mean loss of the last 10 % of steps, and
# the relative weight drift ‖w − w_fp32‖ / ‖w_fp32 − w_0‖ of the final fp32
# weights (model.safetensors; w_0 the shared initialisation). Needs
# /usr/bin/python3 with numpy (Debian's python3-numpy) for the weights.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
dir=${2:-$(mktemp -d)}
mkdir -p "$dir"
export PATH=/usr/local/go/bin:$PATH GOFLAGS=-mod=mod
go build -o "$dir/strata" .
cat README.md docs/*.md */README.md > "$dir/text.txt"
for m in fp32 bf16 int8 remainder; do
  mkdir -p "$dir/swap-$m"
  moments=$m master=fp32
  if [ "$m" = remainder ]; then moments=fp32 master=bf16+remainder; fi
  cat > "$dir/$m.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 20, "warmup_type": "linear", "total_num_steps": $steps}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/swap-$m"}},
  "strata": {"model": "medium", "devices": 1, "seq_len": 128, "seed": 3, "optimizer_state": {"moments": "$moments", "master": "$master"}}
}
JSON
  "$dir/strata" train --config "$dir/$m.json" --data "$dir/text.txt" --steps "$steps" --out "$dir/run-$m" --overwrite --no-progress >/dev/null 2>"$dir/$m.log"
done
# The shared initialisation: step 0 of the same config (no step taken is not
# a run; a 1-step run with lr 0 keeps the initial weights).
sed 's/"lr": 1e-3/"lr": 0/; s/"warmup_max_lr": 1e-3/"warmup_max_lr": 0/' "$dir/fp32.json" > "$dir/init.json"
"$dir/strata" train --config "$dir/init.json" --data "$dir/text.txt" --steps 1 --out "$dir/run-init" --overwrite --no-progress >/dev/null 2>"$dir/init.log"
/usr/bin/python3 - "$dir" "$steps" <<'PY'
import json, struct, sys
import numpy as np
d, steps = sys.argv[1], int(sys.argv[2])
def losses(m):
    return [json.loads(l)["loss"] for l in open(f"{d}/run-{m}/steps.jsonl")]
def weights(m):
    b = open(f"{d}/run-{m}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    base = 8 + n
    return np.concatenate([np.frombuffer(b[base + t["data_offsets"][0]:base + t["data_offsets"][1]], dtype=np.float32).astype(np.float64)
                           for _, t in sorted(h.items())])
L = {m: losses(m) for m in ("fp32", "bf16", "int8", "remainder")}
print(f"medium, stage 3, optimizer on NVMe, {steps} steps, seed 3, the same data: loss")
print("step      fp32      bf16      int8")
for s in list(range(0, steps, max(1, steps // 10))) + [steps - 1]:
    print(f"{s + 1:4d}  {L['fp32'][s]:8.4f}  {L['bf16'][s]:8.4f}  {L['int8'][s]:8.4f}")
w0, wf = weights("init"), weights("fp32")
moved = np.linalg.norm(wf - w0)
tail = max(1, steps // 10)
for m in ("bf16", "int8"):
    fin, ref = L[m][-1], L["fp32"][-1]
    mt, rt = np.mean(L[m][-tail:]), np.mean(L["fp32"][-tail:])
    drift = np.linalg.norm(weights(m) - wf) / moved
    print(f"{m}: final loss {fin:.4f} vs fp32 {ref:.4f} ({(fin - ref) / ref * 100:+.2f} %); last {tail} steps' mean {mt:.4f} vs {rt:.4f} ({(mt - rt) / rt * 100:+.2f} %); weight drift {drift:.4f} of the distance fp32 moved")
same_w = open(f"{d}/run-remainder/model.safetensors", "rb").read() == open(f"{d}/run-fp32/model.safetensors", "rb").read()
same_l = L["remainder"] == L["fp32"]
print(f"bf16+remainder master: losses {'bit-identical to' if same_l else 'DIFFERENT from'} fp32's at all {steps} steps; weights file {'byte-identical' if same_w else 'DIFFERENT'}")
if not (same_l and same_w):
    sys.exit(1)
PY
