#!/usr/bin/env bash
# Downloads kvbench's own dependency wheels for the GPU machine (CPython 3.12, manylinux x86_64),
# which has no network.   usage: scripts/gpu/pack-kvbench-deps.sh [OUT_DIR default .gpukvdeps]
set -euo pipefail
out=${1:-.gpukvdeps}
rm -rf "$out" && mkdir -p "$out"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_34_x86_64 \
         manylinux_2_24_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
PIP_CONSTRAINT= python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$out" pydantic typer rich "aiohttp>=3.10" "pandas>=2.1" pyyaml prometheus_client tokenizers nvidia-ml-py
grep -qx "/$out/" .git/info/exclude 2>/dev/null || echo "/$out/" >> .git/info/exclude
du -sh "$out"
