#!/usr/bin/env bash
# The fleet proof on a 2-GPU host (see docs/fleets.md): two vLLM replicas, own vs shared LMCache tier,
# round robin vs session affinity, and vllm-router cache_aware. Needs vLLM + LMCache importable by $KVBENCH_VLLM_PYTHON (docs/gpu.md).
# Usage: bash scripts/gpu/fleet-2x.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-runs}"
# the VR-cache-own arm starts the vLLM Router from this python (scripts/install-router.sh; lab/gpu-log.md for an
# offline host); fail now rather than after the six other arms
: "${KVBENCH_ROUTER_PYTHON:?set KVBENCH_ROUTER_PYTHON to a python with vllm-router (scripts/install-router.sh)}"
# NVLink multicast stays off on the lent hosts; every replica process inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/kvbench-fleet-shared   # the shared LMCache server's filesystem L2 (a path kvbench must not invent)
nvidia-smi --query-gpu=index,name,memory.total --format=csv
python3 -m kvbench run scenarios/gpu-fleet-llama8b-2x.yaml --output-dir "$out"
run_dir="$(ls -dt "$out"/gpu-fleet-llama8b-2x-* | head -1)"
cat "$run_dir/report/fleet.md"
