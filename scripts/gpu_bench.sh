#!/usr/bin/env bash
# On a GPU machine: (1) batch-256 profiles with cuDNN algorithm tables into memtune/profiler/data, (2) GPU tests,
# (3) `memtune bench` for the models of BENCHMARKS.md. Everything lands in $OUT/bench.tgz.
# Usage (repository root, wheels from scripts/gpu_wheels.sh in .whl/):
#   bash scripts/h200_bench.sh STEPS [model:batch:dtype[:budget] ...]   STEPS: comma list of profiles,tests,bench
#   (budget: the main budget as a fraction of the unconstrained peak, default 0.6)
#   BENCH_ARGS="--no-policies --no-builtins --headroom 0,0.05,0.1,0.2" bash scripts/h200_bench.sh bench ...
set -uo pipefail
OUT=${OUT:-/tmp/out}
steps=${1:-profiles,tests,bench}; shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(vgg16:256:float32 resnet50:256:float32 vgg16:256:bfloat16 resnet50:256:bfloat16 gpt:16:float32 gpt:16:bfloat16)
mkdir -p "$OUT" /tmp/bench/profiles
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=200
# the allocator settings are memtune bench's own (NOTE [ Allocator retries ] in memtune/tuner/runtime/guard.py)
pack() { tar czf "$OUT/bench.tgz" -C /tmp/bench .; }
if [[ $steps == *profiles* ]]; then
  models=$(printf '%s\n' "${configs[@]}" | cut -d: -f1 | grep -v gpt | sort -u | paste -sd,)
  dtypes=$(printf '%s\n' "${configs[@]}" | cut -d: -f3 | sort -u | paste -sd,)
  [ -n "$models" ] && timeout 200 python3 scripts/profile_zoo.py --models "$models" --batches 256 --dtypes "$dtypes" \
    --conv-algos --out memtune/profiler/data 2>&1 | grep -v "stage [0-9]" | tail -6
  cp memtune/profiler/data/*.json /tmp/bench/profiles/
  pack
fi
if [[ $steps == *tests* ]]; then
  timeout 240 python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider 2>&1 | tee /tmp/bench/gpu-tests.txt | tail -5
  pack
fi
if [[ $steps == *bench* ]]; then
  for cfg in "${configs[@]}"; do
    IFS=: read -r model batch dtype budget <<<"$cfg"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-560}" python3 -m api bench "$model" --batch "$batch" --dtype "$dtype" --budget "$(python3 -c "print(f'{float(\"${budget:-0.6}\") * 100:g}% of peak')")" \
      ${BENCH_ARGS:---sweep 0.4,0.5,0.7,0.8 --no-choice} --warmup 2 --iters 6 --json-out "/tmp/bench/bench-$model-b$batch-$dtype.json" 2>&1 \
      | tee "/tmp/bench/bench-$model-b$batch-$dtype.txt" | grep -v "measuring" | tail -24
    pack
  done
fi
pack
