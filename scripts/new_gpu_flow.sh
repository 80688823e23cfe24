#!/usr/bin/env bash
# On a GPU machine: the README's GPU flow as a GPU type without shipped data sees it (MEMTUNE_SHIPPED_DATA=0, an
# empty user folder): profile, tune, bench and the Python API with nothing but the model and the budget.
# Everything it prints lands in $OUT/new-gpu-flow.txt, the kept calibration and profile beside it.
# Usage (repository root, wheels from scripts/gpu_wheels.sh in .whl/):
#   bash scripts/new_gpu_flow.sh [MODEL] [BATCH]         (default: resnet50 128)
set -uo pipefail
OUT=${OUT:-/tmp/out}
model=${1:-resnet50}; batch=${2:-128}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=160 MEMTUNE_SHIPPED_DATA=0 MEMTUNE_DATA_DIR=/tmp/memtune-data
unset MEMTUNE_CALIBRATION_DIR
rm -rf "$MEMTUNE_DATA_DIR"
log="$OUT/new-gpu-flow.txt"
step() { echo "\$ $*" | tee -a "$log"; local t0=$SECONDS; "$@" 2>&1 | tee -a "$log" | tail -30; echo "($((SECONDS - t0)) s)" | tee -a "$log"; }
step python3 -m api profile "$model" --batch "$batch" --device cuda -o /tmp/p.json
cp "$MEMTUNE_DATA_DIR"/calibrations/*.json "$OUT"/ 2>/dev/null
step python3 -m api tune "$model" --batch "$batch" --budget "60% of peak" --plan-out /tmp/plan.json
step python3 -m api bench "$model" --batch "$batch" --budget "60% of peak" --no-policies --no-builtins \
  --json-out "$OUT/new-gpu-flow-bench.json"
cat > /tmp/api_flow.py <<PY
import torch, torchvision, memtune
model = torchvision.models.resnet50().cuda()
x, y = torch.randn($batch // 2, 3, 224, 224, device="cuda"), torch.randint(0, 1000, ($batch // 2,), device="cuda")
tuned = memtune.tune(model, "60% of peak", example_inputs=x, loss_fn=lambda out: torch.nn.functional.cross_entropy(out, y), trials=100)
print(tuned)
planned = memtune.planned(model, tuned)
torch.cuda.reset_peak_memory_stats()
with memtune.budget_guard(tuned.result.budget_bytes, planned):
    for _ in range(3):
        torch.nn.functional.cross_entropy(planned(x), y).backward()
torch.cuda.synchronize()
print("python api: 3 planned steps within", tuned.result.budget_bytes, "bytes; reserved peak", torch.cuda.max_memory_reserved())
PY
step python3 /tmp/api_flow.py
tar czf "$OUT/new-gpu-data.tgz" -C "$MEMTUNE_DATA_DIR" .
