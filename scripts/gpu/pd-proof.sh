#!/usr/bin/env bash
# Prefill/decode disaggregation on 2 GPUs of one host (issue 44; not yet run on GPUs): checks the host and the
# install, then runs kvbench's P/D scenarios (engine kind vllm-pd: prefill vLLM on GPU 0, decode vLLM on GPU 1,
# NIXL push, kvbench's P/D proxy), each beside colocated arms on GPU 0 alone:
#   probe  scenarios/gpu-pd-llama8b-h200x2.yaml        turn-2 TTFT to 128k, colocated vs 1P1D, with/without a CPU tier
#   sweep  scenarios/gpu-pd-sweep-llama8b-h200x2.yaml  capacity at gpu-decode-tax-llama8b-h200's loads, same four arms
#   check  the GPUs, the link between them, that vLLM, LMCache and NIXL import, and that this vLLM's own parser and
#          KVTransferConfig accept every P/D side's command line (scripts/gpu/pd_argv.py; no engine starts)
#   usage: scripts/gpu/pd-proof.sh [check|probe|sweep|both]      (default probe)
# Refuses to run with fewer than 2 GPUs, or without NIXL (vLLM's NIXL connector imports the `nixl` package: add the
# nixl wheel for CUDA 13 at the version vLLM 0.26.0's requirements/kv_connectors.txt names to the wheelhouse,
# ../shared/gpu/wheels.txt, before the session). Installs vLLM + LMCache once through scripts/gpu/kvbench.sh
# (wheelhouse parts in /tmp/wb, docs/gpu.md). Each run's report/pd-breakdown.md takes the P/D arms' TTFT apart;
# a flagged row there (parts that do not add up, transfer figures that break physics) is a finding to read before
# the run is kept. Run it detached (scripts/gpu/detach.sh --script pd-proof.sh both) and follow with
# scripts/gpu/wait.sh. Run directories land in $KVBENCH_RUNS (default /tmp/kvruns).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
what=${1:-probe}
case "$what" in check|probe|sweep|both) ;; *) echo "pd-proof.sh: unknown '$what' (check, probe, sweep or both)" >&2; exit 2 ;; esac
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "pd-proof.sh: this machine has ${gpus:-0} GPU(s); prefill/decode disaggregation needs 2 (ask for nvidia-h200-x2)" >&2
  exit 2
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
# the link NIXL's push will use between GPU 0 and GPU 1 (NV<n>: NVLink; PIX/PHB/SYS: PCIe): the scenarios' kv_link
# (nvlink, 900 GB/s) is the limit the physics check holds transfer figures to
nvidia-smi topo -m || true
if [ ! -f /tmp/site/.kvbench-ok ] && [ ! -f /tmp/wb/SHA256 ]; then
  echo "pd-proof.sh: no wheelhouse in /tmp/wb (../shared/gpu/pack.sh, docs/gpu.md)" >&2
  exit 2
fi
# installs vLLM + LMCache (and kvbench's own wheels) once, and reads both scenarios
"$here/kvbench.sh" validate scenarios/gpu-pd-llama8b-h200x2.yaml scenarios/gpu-pd-sweep-llama8b-h200x2.yaml
if ! PYTHONPATH=/tmp/site python3 -c "import nixl; from nixl._api import nixl_agent; print('nixl', nixl.__file__)"; then
  echo "pd-proof.sh: NIXL does not import from /tmp/site: vLLM's NIXL connector cannot start (see this script's header)" >&2
  exit 2
fi
# every P/D side's command line and kv-transfer-config, as kvbench renders them, through this vLLM's own parser
repo="$(cd "$here/../.." && pwd)"
PYTHONPATH="$repo:/tmp/site:/tmp/kvsite" python3 "$here/pd_argv.py" render scenarios/gpu-pd-llama8b-h200x2.yaml \
  | PYTHONPATH=/tmp/site python3 "$here/pd_argv.py" validate
[ "$what" = check ] && exit 0
# NVLink multicast stays off on the lent hosts; the engines inherit these. UCX_TLS is left unset: UCX picks cuda_ipc
# for GPU-to-GPU copies on one host (kvbench refuses a UCX_TLS without it: the KV would go over TCP)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export KVBENCH_SKIP_INSTALL=1
runs=${KVBENCH_RUNS:-/tmp/kvruns}
status=0
if [ "$what" = probe ] || [ "$what" = both ]; then
  "$here/kvbench.sh" run scenarios/gpu-pd-llama8b-h200x2.yaml -o "$runs" || status=$?
fi
if [ "$what" = sweep ] || [ "$what" = both ]; then
  "$here/kvbench.sh" sweep scenarios/gpu-pd-sweep-llama8b-h200x2.yaml -o "$runs" || status=$?
fi
for breakdown in "$runs"/gpu-pd-*/report/pd-breakdown.md; do
  [ -f "$breakdown" ] && { echo "== $breakdown"; cat "$breakdown"; }
done
exit "$status"
