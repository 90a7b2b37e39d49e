#!/usr/bin/env bash
# The attach proof on one GPU: two vLLM servers started by hand, as a platform team runs them in production (no
# VLLM_SERVER_DEV_MODE, so POST /reset_prefix_cache answers 404), then kvbench attached to both, twice in a row:
#   OFF  vLLM with its GPU prefix cache and no offload tier
#   ON   vLLM with LMCache's in-process connector and a CPU DRAM tier
# Both fit one H200 at a lower memory utilisation. kvbench started neither: it must find turn 1 cold on both runs
# (a per-run prompt salt), make turn 2 a returning user without a reset (filler sized from /metrics), and take the
# ON endpoint's tier as declared (ON:cpu=URL).
#   usage: scripts/gpu/attach-proof.sh [CONTEXTS default 8000,32000,128000]
# Run it detached (scripts/gpu/detach.sh --script attach-proof.sh) and follow with scripts/gpu/wait.sh; expects the
# vLLM + LMCache wheelhouse in /tmp/wb like scripts/gpu/kvbench.sh. Run directories land in $KVBENCH_RUNS
# (default /tmp/kvruns), the engines' logs beside them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
contexts=${1:-8000,32000,128000}
runs=${KVBENCH_RUNS:-/tmp/kvruns}
work=/tmp/attach-proof
mkdir -p "$runs" "$work"
# NVLink multicast stays off on the lent hosts; the engines inherit these
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# installs vLLM + LMCache once (kvbench.sh) and writes the model directory: config + tokenizer, dummy weights
"$here/kvbench.sh" model synth "$work/llama8b" --shape llama-3.1-8b --overwrite
export PYTHONPATH="$(cd "$here/../.." && pwd):/tmp/site:/tmp/kvsite" PYTHONUNBUFFERED=1
unset VLLM_SERVER_DEV_MODE

# 8,400 blocks of 16 tokens = 134,400 tokens of GPU KV cache per server (vLLM needs max_model_len to fit), and the
# filler that evicts it stays short (kvbench reads the size from vllm:cache_config_info)
common=(--model "$work/llama8b" --served-model-name llama-3.1-8b --host 127.0.0.1 --dtype bfloat16
  --load-format dummy --enforce-eager --max-model-len 131072 --gpu-memory-utilization 0.40
  --num-gpu-blocks-override 8400 --enable-prompt-tokens-details)
pids=()
stop_all() { for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; sleep 10; \
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done; }
trap stop_all EXIT
wait_ready() {  # PORT NAME: up to 600 s for /v1/models
  for _ in $(seq 1 300); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=5)" "http://127.0.0.1:$1/v1/models" 2>/dev/null && { echo "$2 ready on :$1"; return 0; }
    sleep 2
  done
  echo "$2 did not come up on :$1" >&2
  tail -n 40 "$runs/engine-$2.log" >&2
  return 1
}
# one at a time: two engines profiling GPU memory at once misread each other's use
setsid python3 -m vllm.entrypoints.openai.api_server "${common[@]}" --port 8100 \
  > "$runs/engine-OFF.log" 2>&1 &
pids+=($!)
wait_ready 8100 OFF
cat > "$work/lmcache.yaml" <<'YAML'
chunk_size: 256
local_cpu: true
max_local_cpu_size: 64
save_unfull_chunk: true
YAML
mkdir -p "$work/prometheus"
LMCACHE_CONFIG_FILE="$work/lmcache.yaml" PROMETHEUS_MULTIPROC_DIR="$work/prometheus" \
  setsid python3 -m vllm.entrypoints.openai.api_server "${common[@]}" --port 8200 \
  --kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}' \
  > "$runs/engine-ON.log" 2>&1 &
pids+=($!)
wait_ready 8200 ON
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv,noheader || true
python3 -c "import vllm, lmcache; print('vllm', vllm.__version__, 'lmcache', getattr(lmcache, '__version__', '?'))"

# what the endpoints report of their GPU KV cache (kvbench sizes its filler from it): the override must show
kv_flag=()
blocks=$(python3 -c "import urllib.request,re; t=urllib.request.urlopen('http://127.0.0.1:8100/metrics').read().decode(); \
m=re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks=\"(\d+)\"', t); print(m.group(1) if m else 'none')")
echo "vllm:cache_config_info num_gpu_blocks=$blocks"
if [ "$blocks" != "8400" ]; then
  echo "the endpoint's /metrics does not report the 8,400-block cache: the filler is sized by --gpu-kv-tokens instead"
  kv_flag=(--gpu-kv-tokens 134400)
fi
status=0
for attempt in 1 2; do
  echo "== run $attempt of 2: $(date -u +%H:%M:%S)"
  python3 -m kvbench run --arm OFF=http://127.0.0.1:8100/v1 --arm ON:cpu=http://127.0.0.1:8200/v1 \
    --contexts "$contexts" --conversations 2 "${kv_flag[@]}" --output-dir "$runs" || status=$?
  echo "== run $attempt exit $status"
done
for port in 8100 8200; do
  python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
    "http://127.0.0.1:$port/metrics" | grep -E '^vllm:(prefix_cache|external_prefix_cache|prompt_tokens)' \
    > "$runs/metrics-$port.txt" || true
done
exit "$status"
