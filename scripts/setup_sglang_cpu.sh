#!/usr/bin/env bash
# Create a separate virtualenv holding SGLang's Python code, for `--engine sglang`'s
# in-process mode (adapters/sglang_cpu) on machines without a GPU, and its tests.
#
# What it is for: SGLang's memory code (radix cache, KV and Mamba pools, their
# allocators) is plain Python over torch; hbench runs those classes on torch's CPU
# build and lets them decide what is cached, matched, evicted and tombstoned. SGLang's
# model kernels (sgl-kernel, flashinfer, CUDA) are never imported, so none is installed.
#
# Why a separate venv: SGLang pins a CUDA torch and ~80 packages (kernels, servers,
# multimodal) that must not leak into hbench's environment. Here torch's CPU build is
# installed first and every other package with --no-deps, pinned, so nothing can pull
# a CUDA torch: only what `import sglang.srt.mem_cache.memory_pool` and
# `...unified_radix_cache` need at import time (found by importing them until they
# load). The one module that cannot be installed (torchvision: its PyPI wheel is
# CUDA-linked and fails against the CPU torch) is stubbed by
# adapters/sglang_cpu/stubs.py, which says why.
#
# hbench itself is installed editable without dependencies (a .pth finder): the
# worker imports hbench's engine core, scheduler values and cost model, which need
# numpy only (already here for SGLang).
#
# Usage: scripts/setup_sglang_cpu.sh [VENV_DIR]   (default .venv-sglang)
# Afterwards: export HBENCH_SGLANG_PYTHON=$PWD/.venv-sglang/bin/python
# HBENCH_SETUP_SELF=0 installs SGLang and its imports only, not this checkout
# (.ci/run builds the venvs side by side, then installs the checkout into each).
set -euo pipefail

VENV="${1:-.venv-sglang}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.hbench-sglang-ready"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
start=$(date +%s)

check() {
  PYTHONPATH="$REPO" "$VENV/bin/python" -m adapters.sglang_cpu.stubs --check
}

install_self() {
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$REPO"
  check
}

if [[ -f "$STAMP" ]]; then
  echo "sglang venv already set up at $VENV ($(cat "$STAMP"))"
  if [[ "${HBENCH_SETUP_SELF:-1}" == 1 ]]; then install_self; fi
  exit 0
fi

"$PY" -m venv "$VENV"
# torch's CPU build first: nothing installed after it may replace it
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet --no-deps "sglang==$SGLANG_VERSION"
# What SGLang's memory modules import at module level, each pinned, no dependencies:
#   numpy, triton (memory_pool.py defines Triton kernels at import; never launched here),
#   transformers + tokenizers + safetensors + huggingface_hub + regex + pyyaml + filelock
#     + fsspec + packaging + tqdm (sglang.srt.configs, imported by memory_pool.py),
#   the rest are imported by sglang.srt.utils / server_args / managers at module level.
"$VENV/bin/python" -m pip install --quiet --no-deps \
  numpy==2.4.6 triton==3.9.0 \
  transformers==5.19.0 tokenizers==0.23.3 safetensors==0.8.0 huggingface_hub==2.4.0 \
  regex==2026.11.19 PyYAML==6.0.4 filelock==4.3.1 fsspec==2026.9.0 packaging==26.4 \
  tqdm==4.70.1 typing_extensions==4.16.0 \
  httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 truststore==0.10.5 anyio==4.16.0 sniffio==1.3.1 \
  certifi==2026.10.19.post1 idna==3.20 urllib3==2.8.0 requests==2.34.2 \
  orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 pillow==13.0.0 starlette==1.10.0 \
  msgspec==0.23.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1 Pygments==2.21.0 \
  aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4 \
  aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 \
  dill==0.4.1 apache-tvm-ffi==0.1.15.post2 sentencepiece==0.2.3 compressed-tensors==0.18.0 \
  loguru==0.7.3 gguf==0.19.0 openai==3.57.0 partial-json-parser==0.2.1.1.post7
if [[ "${HBENCH_SETUP_SELF:-1}" == 1 ]]; then install_self; fi

end=$(date +%s)
size=$(du -sh "$VENV" | cut -f1)
echo "sglang $SGLANG_VERSION" > "$STAMP"
echo "sglang $SGLANG_VERSION (memory code, torch CPU) installed in $VENV: $((end - start)) s, $size"
echo "export HBENCH_SGLANG_PYTHON=$(cd "$VENV" && pwd)/bin/python"
