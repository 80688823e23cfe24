#!/usr/bin/env bash
# Wheels for a GPU machine without a network: fills .whl/ (or the folder given with -d) with the wheels of
# memtune's runtime dependencies, for Python 3.12 on x86-64 Linux, leaving out what a CUDA PyTorch image
# already holds (torch and its own dependencies, NumPy, Jinja2, httpx, typer, rich, ...), so that installing them
# with --no-deps shadows none of the image's packages.
#
#   scripts/gpu_wheels.sh                  # the runtime set, into .whl/
#   scripts/gpu_wheels.sh -d DIR NAME...   # into DIR, plus more PyPI names
#
# Keep the folder out of git (echo /.whl/ >> .git/info/exclude). On the GPU machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
dest=.whl
if [[ ${1:-} == -d ]]; then dest=$2; shift 2; fi
# memtune's own runtime dependencies that a CUDA PyTorch image lacks (pyproject.toml lists them all)
want=(optuna sqlalchemy alembic fastapi uvicorn pydantic pydantic-settings swagger-ui-bundle "$@")
# what the image provides: never shadowed by a wheel from here
keep_image=" torch torchvision triton numpy sympy mpmath networkx jinja2 markupsafe filelock fsspec typing-extensions
setuptools pip wheel packaging pyyaml tqdm rich typer click shellingham markdown-it-py mdurl pygments httpx httpcore
h11 anyio idna sniffio certifi "
keep_image=" ${keep_image//$'\n'/ } "
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" "${want[@]}"
mkdir -p "$dest"
for w in "$tmp"/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | tr '[:upper:]_.' '[:lower:]--')
  [[ $keep_image == *" $name "* || $name == nvidia-* ]] && continue
  cp "$w" "$dest/"
done
ls "$dest"
du -sh "$dest"
