#!/usr/bin/env bash
# The parity check of fp16 mixed precision (the fp16 block, DeepSpeed's
# dynamic loss scaling with its defaults): the same run, seed and data in
# bf16 and in fp16 — the `medium` model on real text (this repository's
# documentation, byte-level), ZeRO stage 2, optimizer on the host — and the
# fp16 run's loss curve, loss scale and skipped steps against bf16's.
#
#   bench/fp16-parity.sh [STEPS] [DIR]     (default 200 steps, a temp dir)
#
# Prints the loss every STEPS/10 steps side by side with the fp16 scale, the
# final loss and the mean of the last 10 % of steps with their relative
# difference to bf16's, and the steps fp16 skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
dir=${2:-$(mktemp -d)}
mkdir -p "$dir"
export PATH=/usr/local/go/bin:$PATH GOFLAGS=-mod=mod
go build -o "$dir/strata" .
cat README.md docs/*.md */README.md > "$dir/text.txt"
for p in bf16 fp16; do
  prec='"bf16": {"enabled": true}'
  if [ "$p" = fp16 ]; then
    prec='"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}'
  fi
  cat > "$dir/$p.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 20, "warmup_type": "linear", "total_num_steps": $steps}},
  $prec,
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "medium", "devices": 1, "seq_len": 128, "seed": 3}
}
JSON
  "$dir/strata" train --config "$dir/$p.json" --data "$dir/text.txt" --steps "$steps" --out "$dir/run-$p" --overwrite --no-progress >/dev/null 2>"$dir/$p.log"
done
/usr/bin/python3 - "$dir" "$steps" <<'PY'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
def lines(p):
    return [json.loads(l) for l in open(f"{d}/run-{p}/steps.jsonl")]
B, F = lines("bf16"), lines("fp16")
print(f"medium, stage 2, optimizer on the host, {steps} steps, seed 3, the same data: loss")
print("step      bf16      fp16   fp16 scale")
for s in list(range(0, steps, max(1, steps // 10))) + [steps - 1]:
    fl = F[s]["loss"]
    print(f"{s + 1:4d}  {B[s]['loss']:8.4f}  {fl:8.4f}   {F[s]['loss_scale']:g}{' skipped' if F[s].get('skipped') else ''}")
tail = max(1, steps // 10)
fb, ff = B[-1]["loss"], F[-1]["loss"]
mb = sum(l["loss"] for l in B[-tail:]) / tail
mf = sum(l["loss"] for l in F[-tail:]) / tail
skipped = [l["step"] for l in F if l.get("skipped")]
print(f"fp16: final loss {ff:.4f} vs bf16 {fb:.4f} ({(ff - fb) / fb * 100:+.2f} %); last {tail} steps' mean {mf:.4f} vs {mb:.4f} ({(mf - mb) / mb * 100:+.2f} %)")
print(f"fp16: {len(skipped)} steps skipped {skipped[:20]}; scale at the end {F[-1]['loss_scale']:g}")
PY
