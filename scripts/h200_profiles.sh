#!/usr/bin/env bash
# On the GPU machine: GPU tests, then measured profiles of the zoo into $OUT/profiles.tgz.
# Usage (repository root, wheels from ../shared/tools/device-wheels in .whl/):  bash scripts/h200_profiles.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/prof
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" | tee "$OUT/versions.txt"
timeout 150 python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -x 2>&1 | tee "$OUT/gpu-tests.txt" | tail -15
run() { timeout "$1" python3 scripts/profile_zoo.py --out /tmp/prof --skip-existing "${@:2}" 2>&1 | tee -a "$OUT/profile-log.txt" | grep -v "^ " | tail -4; }
run 150 --models vgg16,resnet50 --batches 64,128,256 --dtypes float32,bfloat16
run 90 --models gpt --batches 8,16 --dtypes float32,bfloat16
run 90 --models vgg19,alexnet,overfeat,resnet18 --batches 256 --dtypes float32,bfloat16
tar czf "$OUT/profiles.tgz" -C /tmp/prof . && ls /tmp/prof | tee "$OUT/profiles.txt"
