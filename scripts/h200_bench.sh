#!/usr/bin/env bash
# On the GPU machine: GPU tests, then `memtune bench` for the models of BENCHMARKS.md into $OUT/bench.tgz.
# Usage (repository root, wheels from ../shared/tools/device-wheels in .whl/):
#   bash scripts/h200_bench.sh [tests|bench|all] [model:batch:dtype ...]
set -uo pipefail
OUT=${OUT:-/tmp/out}
what=${1:-all}; shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(vgg16:256:float32 resnet50:256:float32 vgg16:256:bfloat16 resnet50:256:bfloat16 gpt:16:float32 gpt:16:bfloat16)
mkdir -p "$OUT" /tmp/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "$what" != bench ]; then
  timeout 240 python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider 2>&1 | tee /tmp/bench/gpu-tests.txt | tail -25
fi
if [ "$what" != tests ]; then
  for cfg in "${configs[@]}"; do
    IFS=: read -r model batch dtype <<<"$cfg"
    timeout 170 python3 -m api bench "$model" --batch "$batch" --dtype "$dtype" --budget 0.6 --sweep 0.4,0.5,0.7,0.8 \
      --warmup 2 --iters 6 --json-out "/tmp/bench/bench-$model-b$batch-$dtype.json" 2>&1 \
      | tee "/tmp/bench/bench-$model-b$batch-$dtype.txt" | grep -v "measuring" | tail -30
  done
fi
tar czf "$OUT/bench.tgz" -C /tmp/bench .
