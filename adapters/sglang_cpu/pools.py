"""SGLang's dual pools (a KV pool plus a Mamba state pool) from hbench's byte budget.

Runs inside the SGLang venv (`adapters.sglang_cpu`). hbench's budget is one
byte target per *pool layer* (harness/budget.py): for Falcon-H1 one attention
layer and one Mamba layer. So SGLang's pools are built for one pool layer
(one full-attention layer id, one Mamba layer id) with the model's real
per-layer shapes, and every count read back from SGLang's objects is a count
per pool layer, as hbench's organizations count theirs; the whole model
holds ``pool_layers`` such copies. The tensors are real (on the CPU): for
Falcon-H1-7B at b83 about 132 MB.

The split of the bytes is SGLang's rule, not hbench's:
``kv_cache_configurator.py:3350-3385`` (``ModelRunnerKVCacheMixin``'s
ratio-based branch) gives the Mamba pool ``rest x r / (1 + r)`` bytes with
``r = mamba_full_memory_ratio`` and makes ``(mamba_bytes - slot) // slot``
slots of it (one more slot is SGLang's padding slot, which its pool
allocates and never hands out); the remaining bytes become KV tokens at the
KV pool's bytes per token, less SGLang's padding page, rounded down to its
page size. That
configurator needs a whole ``ServerArgs`` + ``ModelConfig`` (a model
checkpoint), so its arithmetic is restated in `split` with that citation;
the pools themselves are SGLang's classes (`build`), and what they hold is
read back from them (`SglangPools.describe`).
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.sglang_cpu.stubs import install

install()

import torch  # noqa: E402
from sglang.srt.configs.mamba_utils import (  # noqa: E402
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
)
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import (  # noqa: E402
    HybridLinearKVPool,
    HybridReqToTokenPool,
)
from sglang.srt.mem_cache.unified_memory_pool import init_unified_mamba_pools  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class PoolSplit:
    """SGLang's split of one pool layer's bytes (`split`)."""

    budget_bytes: int
    mamba_full_memory_ratio: float
    mamba_slots: int          # usable slots (SGLang's max_mamba_cache_size)
    kv_tokens: int            # KV pool size in tokens, a whole number of pages


def cache_params(geom) -> Mamba2CacheParams:
    """SGLang's Mamba2 state description of one of ``geom``'s SSM layers."""
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=geom.ssm_d_inner, n_groups=geom.ssm_n_groups,
        num_heads=geom.ssm_n_heads, head_dim=geom.ssm_head_dim, state_size=geom.ssm_d_state,
        conv_kernel=geom.ssm_d_conv)
    dtype = Mamba2StateDType(conv=DTYPES[geom.dtype], temporal=DTYPES[geom.ssm_state_dtype])
    return Mamba2CacheParams(shape=shape, dtype=dtype, layers=[0])


def kv_bytes_per_token(geom) -> int:
    """K and V of one attention layer, per token (MHATokenToKVPool's cell)."""
    return 2 * geom.num_kv_heads * geom.head_dim * DTYPES[geom.dtype].itemsize


def split(budget_bytes: int, geom, ratio: float, page_size: int) -> PoolSplit:
    """SGLang's ratio-based sizing (kv_cache_configurator.py:3350-3385) of
    ``budget_bytes`` for one pool layer."""
    per_slot = cache_params(geom).mamba_cache_per_req
    mamba_budget = budget_bytes * ratio / (1 + ratio)
    slots = int((mamba_budget - per_slot) // per_slot)
    rest = budget_bytes - (slots + 1) * per_slot
    # the KV pool allocates one padding page past its size (memory_pool.py's
    # MHATokenToKVPool buffers are size + page_size tokens long)
    tokens = (int(rest // kv_bytes_per_token(geom)) - page_size) // page_size * page_size
    return PoolSplit(budget_bytes, ratio, slots, tokens)


@dataclass
class SglangPools:
    """SGLang's objects for one pool layer: the request-to-token pool with its
    Mamba pool, the hybrid KV pool and its token allocator."""

    req_to_token_pool: HybridReqToTokenPool
    kv_pool: HybridLinearKVPool
    allocator: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator
    page_size: int

    unified: object = None    # SGLang's UnifiedKVPool (the one buffer), or None
    entry_bytes: tuple[int, int] = (0, 0)   # unified: (KV token, Mamba slot) bytes

    def describe(self) -> dict:
        """What SGLang's objects were given, read from them: slots and tokens,
        and the bytes of their tensors (one pool layer). Under unified memory
        the KV tokens and Mamba slots are each what the whole region would hold
        (the sides float), and ``unified_bytes`` is the one buffer's size."""
        if self.unified is not None:
            return {
                "unified_bytes": int(self.unified.total_bytes),
                "mamba_slots": int(self.req_to_token_pool.mamba_pool.size),
                "mamba_free_slots": int(self.req_to_token_pool.mamba_allocator.available_size()),
                "kv_tokens": int(self.kv_pool.size),
                "kv_free_tokens": int(self.allocator.available_size()),
                "page_size": self.page_size,
                "req_slots": int(self.req_to_token_pool.size),
            }
        mamba = self.req_to_token_pool.mamba_pool
        mamba_bytes = sum(t.numel() * t.element_size() for t in mamba.mamba_cache.conv)
        mamba_bytes += mamba.mamba_cache.temporal.numel() * mamba.mamba_cache.temporal.element_size()
        full = self.kv_pool.full_kv_pool
        kv_bytes = sum(t.numel() * t.element_size() for t in (*full.k_buffer, *full.v_buffer))
        return {
            "mamba_slots": int(mamba.size),
            "mamba_pool_bytes": int(mamba_bytes),
            "mamba_free_slots": int(self.req_to_token_pool.mamba_allocator.available_size()),
            "kv_tokens": int(self.kv_pool.size),
            "kv_pool_bytes": int(kv_bytes),
            "kv_free_tokens": int(self.allocator.available_size()),
            "page_size": self.page_size,
            "req_slots": int(self.req_to_token_pool.size),
        }


def build(geom, pool_split: PoolSplit, *, page_size: int, max_running: int,
          max_context: int) -> SglangPools:
    """SGLang's pools for one pool layer, sized by ``pool_split``, on the CPU."""
    req_pool = HybridReqToTokenPool(
        size=max_running, mamba_size=pool_split.mamba_slots, mamba_spec_state_size=0,
        max_context_len=max_context, device="cpu", enable_memory_saver=False,
        cache_params=cache_params(geom), mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False, enable_overlap_schedule=False)
    kv_pool = HybridLinearKVPool(
        size=pool_split.kv_tokens, dtype=DTYPES[geom.dtype], page_size=page_size,
        head_num=geom.num_kv_heads, head_dim=geom.head_dim, full_attention_layer_ids=[0],
        device="cpu", mamba_pool=req_pool.mamba_pool)
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(pool_split.kv_tokens, DTYPES[geom.dtype], "cpu",
                                           kv_pool, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(pool_split.kv_tokens, page_size,
                                                DTYPES[geom.dtype], "cpu", kv_pool,
                                                need_sort=False)
    return SglangPools(req_pool, kv_pool, allocator, page_size)


def build_unified(geom, pool_split: PoolSplit, *, max_running: int,
                  max_context: int) -> SglangPools:
    """SGLang's unified memory (``--enable-unified-memory``) for one pool layer:
    ``init_unified_mamba_pools`` (``mem_cache/unified_memory_pool.py:1593``)
    builds one byte buffer of ``kv_tokens`` x KV entry + ``mamba_slots`` x Mamba
    entry (the same split's bytes, so the same budget), full attention growing
    down from the top and Mamba states up from the bottom; SGLang's
    ``UnifiedMambaTokenToKVPoolAllocator`` moves the frontier while serving
    (``mamba_full_memory_ratio`` then only sizes the total, as SGLang says).
    Its allocator reads the published parallel config, so ``ServerArgs`` is
    published first (`tree.publish_server_args`)."""
    from adapters.sglang_cpu.tree import publish_server_args
    publish_server_args(1)
    bundle = init_unified_mamba_pools(
        device="cpu", kv_cache_dtype=DTYPES[geom.dtype], head_num=geom.num_kv_heads,
        head_dim=geom.head_dim, page_size=1, start_layer=0, end_layer=0,
        is_draft_worker=False, use_mla_backend=False, mamba_layer_ids=[0],
        full_attention_layer_ids=[0], mamba2_cache_params=cache_params(geom),
        model_context_len=max_context, extra_max_context_len=0,
        max_total_num_tokens=pool_split.kv_tokens, max_mamba_cache_size=pool_split.mamba_slots,
        max_num_reqs=max_running, enable_memory_saver=False, enable_mamba_extra_buffer=False,
        enable_mamba_extra_buffer_lazy=False, speculative_num_draft_tokens=None,
        disable_overlap_schedule=True, need_sort=False)
    return SglangPools(bundle.req_to_token_pool, bundle.token_to_kv_pool,
                       bundle.token_to_kv_pool_allocator, 1, unified=bundle.unified_memory_pool,
                       entry_bytes=(kv_bytes_per_token(geom), cache_params(geom).mamba_cache_per_req))
