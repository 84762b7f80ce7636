#!/usr/bin/env bash
# Download the wheels kcoral-evolve needs on a GPU host that cannot reach a package index
# (CPython 3.12, x86-64 Linux by default). Torch, Triton, CuPy and NumPy are expected to be
# installed there already; fla-core (the baseline of the KDA benchmark) is included.
#   scripts/offline-wheels.sh DIR [PYTHON_VERSION]
# then, on the GPU host:
#   pip install --no-index --no-deps --target SITE DIR/*.whl && export PYTHONPATH=SITE:$PWD
set -euo pipefail
dest=${1:?usage: scripts/offline-wheels.sh DIR [PYTHON_VERSION]}
py=${2:-3.12}
mkdir -p "$dest"
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
args=(--no-deps --only-binary=:all: --python-version "$py" --implementation cp -d "$dest")
for p in "${platforms[@]}"; do args+=(--platform "$p"); done
python3 -m pip download "${args[@]}" \
    starlette uvicorn python-multipart tenacity sqlalchemy alembic mako \
    pydantic pydantic-core annotated-types typing-inspection \
    httpx httpcore h11 anyio idna certifi sniffio jinja2 markupsafe \
    rich markdown-it-py mdurl pygments 'ml-dtypes<0.7' \
    fla-core==0.6.0 einops
ls "$dest"
