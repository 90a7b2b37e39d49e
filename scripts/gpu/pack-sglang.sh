#!/usr/bin/env bash
# Builds SGLang's offline wheelhouse for the GPU machine (CPython 3.12, torch 2.11.0+cu130, no network),
# proves it closed, and cuts it into parts that fit one device call each.
#   usage: scripts/gpu/pack-sglang.sh [OUT_DIR]     (from the project root; default OUT_DIR=.gpusglang)
# Needs a CPython 3.12 for the closure check: $PYTHON312, else python3.12 on PATH.
# Afterwards OUT_DIR holds part00..partNN (40 MiB each: with the ~22 MB checkout a call carries < 64 MiB),
# SHA256 and install-sglang.sh. Carry them to /tmp/wbs on the machine, one part per call
# (docs/gpu.md, "SGLang"), then run scripts/gpu/sglang-proof.sh there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list="$here/sglang-wheels.txt"
out=${1:-.gpusglang}
py=${PYTHON312:-python3.12}
"$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
  || { echo "pack-sglang.sh: the closure check needs CPython 3.12: set PYTHON312 (tried '$py')" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_24_x86_64 manylinux_2_26_x86_64 \
         manylinux1_x86_64 manylinux_2_5_x86_64; do plat+=(--platform "$p"); done
PIP_CONSTRAINT= python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$work/wheels" -r "$list"
echo "downloaded $(ls "$work/wheels" | wc -l) wheels ($(du -sh "$work/wheels" | cut -f1))"

# Closure check, offline: a CPython 3.12 venv holding empty stand-ins (dist-info only) for what the
# GPU image provides (the list's "# provided:" line), then a dry-run install of the whole list from
# the downloaded wheels alone. pip fails here if any requirement of any wheel is missing or conflicts.
"$py" -m venv "$work/venv"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for pin in $(sed -n 's/^# provided: //p' "$list"); do
  name=${pin%%==*} version=${pin#*==}
  dist="$site/${name//-/_}-$version.dist-info"  # a dist-info folder's name has no '-' inside the name
  mkdir -p "$dist"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$version" > "$dist/METADATA"
  echo stand-in > "$dist/INSTALLER" && : > "$dist/RECORD"
done
PIP_CONSTRAINT= "$work/venv/bin/python" -m pip install -q --dry-run --no-index --find-links "$work/wheels" \
  --report "$work/closure.json" -r <(grep -v '^#' "$list")
"$work/venv/bin/python" - "$work/closure.json" "$list" <<'PY'
import json, sys
report, listed = sys.argv[1], sys.argv[2]
wanted = {line.split("==")[0].lower().replace("_", "-") for line in open(listed) if line.strip() and not line.startswith("#")}
got = {item["metadata"]["name"].lower().replace("_", "-") for item in json.load(open(report))["install"]}
if got != wanted:
    sys.exit(f"closure check: resolved set differs from the list: extra {sorted(got - wanted)}, unused {sorted(wanted - got)}")
print(f"closure check: {len(got)} wheels, every requirement met offline (torch & co. as stand-ins)")
PY

# The CUDA question: the GPU machine's torch is 2.11.0+cu130, so SGLang's kernels must link CUDA 13
unzip -q "$work"/wheels/sglang_kernel-*.whl sgl_kernel/sm90/common_ops.abi3.so -d "$work/kernel"
kernel_so=$(grep -a -o -m1 'libcudart\.so\.[0-9]*' "$work/kernel/sgl_kernel/sm90/common_ops.abi3.so" || true)
[ "$kernel_so" = libcudart.so.13 ] \
  || { echo "pack-sglang.sh: sglang-kernel links '$kernel_so', not libcudart.so.13 (CUDA 13)" >&2; exit 1; }
echo "sglang-kernel links $kernel_so (CUDA 13, as torch 2.11.0+cu130)"

tar cf "$work/bundle.tar" -C "$work/wheels" .
rm -rf "$out" && mkdir -p "$out"
(cd "$out" && split -b 40M -d "$work/bundle.tar" part)
sha256sum "$work/bundle.tar" | cut -d' ' -f1 > "$out/SHA256"
cp "$here/install-sglang.sh" "$out/install-sglang.sh"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
for dir in "$out" .gpucarry; do grep -qx "/$dir/" "$exclude" 2>/dev/null || echo "/$dir/" >> "$exclude"; done
parts=$(ls "$out"/part* | wc -l)
echo "$out: $parts parts of <= 40 MiB ($(du -sh "$work/bundle.tar" | cut -f1) in all): $parts device calls to carry"
