#!/usr/bin/env bash
# SGLang on one GPU (issue 43): installs SGLang 0.5.17 once into /tmp/site-sglang, checks that it imports with
# the machine's torch 2.11.0+cu130, then runs kvbench's SGLang scenarios:
#   probe  scenarios/gpu-sglang-llama8b-hicache.yaml   turn-2 TTFT to 128k, radix cache only vs HiCache CPU tier
#   sweep  scenarios/gpu-sweep-sglang-llama8b-h200.yaml  capacity at gpu-decode-tax-llama8b-h200's loads (vLLM, H200)
#   check  the install and the import only
#   usage: scripts/gpu/sglang-proof.sh [probe|sweep|both|check]      (default probe)
# Expects the SGLang wheelhouse parts in /tmp/wbs (scripts/gpu/pack-sglang.sh, carried one part per call:
# docs/gpu.md) and, optionally, kvbench's own dependency wheels in /tmp/kvdeps (pack-kvbench-deps.sh). SGLang runs
# from its own python path only (/tmp/site-sglang, never vLLM's /tmp/site): kvbench starts it through a small
# wrapper, $KVBENCH_SGLANG_PYTHON. Run the scenarios detached (scripts/gpu/detach.sh --script sglang-proof.sh
# sweep) and follow with scripts/gpu/wait.sh. Run directories land in $KVBENCH_RUNS (default /tmp/kvruns).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
what=${1:-probe}
case "$what" in probe|sweep|both|check) ;; *) echo "sglang-proof.sh: unknown '$what' (probe, sweep, both or check)" >&2; exit 2 ;; esac
site=/tmp/site-sglang
if [ ! -f "$site/.kvbench-ok" ]; then
  [ -f /tmp/wbs/SHA256 ] || { echo "sglang-proof.sh: no wheelhouse in /tmp/wbs (scripts/gpu/pack-sglang.sh, docs/gpu.md)" >&2; exit 2; }
  bash /tmp/wbs/install-sglang.sh
  touch "$site/.kvbench-ok"
fi
# SGLang's python: the machine's python3 seeing only SGLang's wheels beside the image's packages
wrapper=/tmp/sglang-python/python3
mkdir -p "$(dirname "$wrapper")"
printf '#!/bin/sh\nPYTHONPATH=%s exec python3 "$@"\n' "$site" > "$wrapper"
chmod +x "$wrapper"
"$wrapper" -c "import sglang, sgl_kernel, torch; print('sglang', sglang.__version__, 'torch', torch.__version__, \
  'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0))"
# the image's torchvision / torchaudio (not in the wheelhouse: SGLang pins torchaudio==2.11.0, takes any torchvision)
"$wrapper" -c "import torchvision, torchaudio; print('torchvision', torchvision.__version__, 'torchaudio', \
  torchaudio.__version__)" || echo "sglang-proof.sh: torchvision/torchaudio do not import on this machine (see above)"
[ "$what" = check ] && exit 0
export KVBENCH_SGLANG_PYTHON="$wrapper" KVBENCH_SKIP_INSTALL=1
# NVLink multicast stays off on the lent hosts; the engines inherit these
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
runs=${KVBENCH_RUNS:-/tmp/kvruns}
# SGLang's whole /metrics page every 20 s beside the run directories (scripts/gpu/wait.sh returns them with the runs):
# a counter that kvbench's metric table names differently in this SGLang version is still on record
raw="$runs/sglang-metrics"
mkdir -p "$raw"
(
  while sleep 20; do
    for port in $(ps -eo args | grep -o -- 'sglang.launch_server.*--port [0-9]*' | grep -o '[0-9]*$' | sort -u); do
      curl -s -m 5 "http://127.0.0.1:$port/metrics" > "$raw/$(date +%s)-$port.prom" || true
    done
  done
) &
dumper=$!
trap 'kill "$dumper" 2>/dev/null || true' EXIT
status=0
if [ "$what" = probe ] || [ "$what" = both ]; then
  "$here/kvbench.sh" run scenarios/gpu-sglang-llama8b-hicache.yaml -o "$runs" || status=$?
fi
if [ "$what" = sweep ] || [ "$what" = both ]; then
  "$here/kvbench.sh" sweep scenarios/gpu-sweep-sglang-llama8b-h200.yaml -o "$runs" || status=$?
fi
exit "$status"
