#!/usr/bin/env bash
# On a GPU machine: measured profiles of the zoo for this GPU type (the set memtune ships for every GPU type:
# VGG-16 and ResNet-50 at batch 64, 128 and 256 — batch 256 with cuDNN algorithm tables —, GPT at 8 and 16,
# VGG-19, AlexNet, OverFeat and ResNet-18 at 256; float32 and bfloat16), then the GPU tests.
# Everything lands in $OUT (profiles.tgz, the log, versions); copy the profiles into memtune/profiler/data.
# Usage (repository root, wheels from scripts/gpu_wheels.sh in .whl/):
#   bash scripts/gpu_profiles.sh [STEPS]      STEPS: comma list of algos,plain,tests (default: algos,plain)
set -uo pipefail
OUT=${OUT:-/tmp/out}
steps=${1:-algos,plain}
mkdir -p "$OUT" /tmp/prof
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" | tee "$OUT/versions.txt"
run() { timeout "$1" python3 scripts/profile_zoo.py --out /tmp/prof --skip-existing "${@:2}" 2>&1 | tee -a "$OUT/profile-log.txt" | grep -v "stage [0-9]" | tail -6; }
pack() { tar czf "$OUT/profiles.tgz" -C /tmp/prof . && ls /tmp/prof > "$OUT/profiles.txt"; }
if [[ $steps == *algos* ]]; then
  run 300 --models vgg16,resnet50 --batches 256 --dtypes float32,bfloat16 --conv-algos
  pack
fi
if [[ $steps == *plain* ]]; then
  run 150 --models vgg16,resnet50 --batches 64,128 --dtypes float32,bfloat16
  run 90 --models gpt --batches 8,16 --dtypes float32,bfloat16
  run 120 --models vgg19,alexnet,overfeat,resnet18 --batches 256 --dtypes float32,bfloat16
  pack
fi
if [[ $steps == *tests* ]]; then
  timeout 240 python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt" | tail -8
fi
