#!/usr/bin/env bash
# Runs ON the GPU machine: joins the SGLang wheelhouse parts gathered in /tmp/wbs (pack-sglang.sh),
# checks them against SHA256, installs into /tmp/site-sglang (apart from vLLM's /tmp/site).
# Afterwards: export PYTHONPATH=/tmp/site-sglang  (python3 there is the one with torch 2.11.0+cu130)
set -euo pipefail
cd /tmp/wbs
cat part* > /tmp/sglang-bundle.tar
[ "$(sha256sum /tmp/sglang-bundle.tar | cut -d' ' -f1)" = "$(cat SHA256)" ] \
  || { echo "install-sglang.sh: bundle checksum mismatch: a part is missing or damaged"; exit 1; }
rm -rf /tmp/sglang-wheels && mkdir -p /tmp/sglang-wheels && tar xf /tmp/sglang-bundle.tar -C /tmp/sglang-wheels
rm -f /tmp/sglang-bundle.tar
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-sglang \
  /tmp/sglang-wheels/*.whl
PYTHONPATH=/tmp/site-sglang python3 -c "import sglang, sgl_kernel, torch; print('sglang', sglang.__version__, \
  'sgl_kernel ok, torch', torch.__version__, 'cuda', torch.version.cuda)"
