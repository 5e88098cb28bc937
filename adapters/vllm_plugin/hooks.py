"""Where the plugin meets vLLM 0.32.0's allocator (imports vLLM; engine core only).

Two redirections, both made before the engine core builds its scheduler:

- ``vllm.v1.core.kv_cache_coordinator.BlockPool`` (the coordinator builds its
  pool by that module-global name) becomes `MemberPagesBlockPool` for S1/S2;
- ``KVCacheSpecRegistry.get_manager_class`` returns `OrgMambaManager` where it
  would return ``MambaManager``. The engine core re-runs the spec
  registration, so the lookup is redirected instead of registering a second,
  conflicting manager for ``MambaSpec``.

`OrgMambaManager` configures the pool from its ``MambaSpec`` (S1/S2) or carves
the private checkpoint pool (D0), and makes the scheduler ask for the
organization's page count before it allocates. Under S1's or S2's negative
control `place_states` also redirects ``KVCacheBlocks.get_block_ids`` (every
block id the scheduler sends the worker goes through it), so the kernel
reads and writes each checkpoint's state at the page `MemberPagesMixin.placed_id`
names.
"""

from __future__ import annotations

import json
import math
import sys

import vllm.v1.core.kv_cache_coordinator as coordinator_module
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

from adapters.vllm_plugin.d0 import block_id_range, carve_private_pool
from adapters.vllm_plugin.pages import MemberPagesMixin
from adapters.vllm_plugin.plan import PageLayout, Plan, d0_split

RESOLVED_TAG = "hbench-plugin-resolved"
COUNTERS_TAG = "hbench-plugin-counters"

_PLAN: Plan | None = None


class MemberPagesBlockPool(MemberPagesMixin, BlockPool):
    """vLLM's block pool with S1/S2 carriers (see `MemberPagesMixin`)."""


def state_bytes(spec) -> tuple[int, int]:
    """(SSM bytes, conv bytes) of one layer's Mamba2 state from a ``MambaSpec``.

    vLLM's Mamba2 state is ``(conv_state, ssm_state)`` in ``spec.shapes``."""
    import torch

    sizes = [math.prod(shape) * torch.empty((), dtype=dtype).element_size()
             for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)]
    if len(sizes) != 2:
        raise RuntimeError(f"hbench plugin expects a Mamba2 state (conv, ssm); got shapes {spec.shapes}")
    conv, ssm = sizes
    return ssm, conv


def emit(tag: str, payload: dict) -> None:
    """One log line the hbench adapter parses from the server's output."""
    print(f"{tag} {json.dumps(payload, sort_keys=True)}", file=sys.stderr, flush=True)


class OrgMambaManager(MambaManager):
    """vLLM's Mamba manager, allocating as the plan's organization."""

    def __init__(self, kv_cache_spec, block_pool, **kwargs):
        super().__init__(kv_cache_spec, block_pool, **kwargs)
        plan = _PLAN
        self.plan = plan
        ssm, conv = state_bytes(kv_cache_spec)
        page = kv_cache_spec.page_size_bytes
        resolved = {"org": plan.org, "block_size": kv_cache_spec.block_size,
                    "page_bytes": page, "mamba_state_bytes": ssm + conv,
                    "mamba_padding_bytes": page - (ssm + conv), "ssm_bytes": ssm,
                    "conv_bytes": conv, "num_blocks": block_pool.num_gpu_blocks,
                    "grid_tokens": plan.grid_tokens}
        self.shared_pool = block_pool
        if plan.org == "d0":
            attn, ckpt = d0_split(block_pool.num_gpu_blocks, plan.d0_attn_fraction)
            self.attention_blocks, self.checkpoint_blocks = attn, ckpt
            self.block_pool = carve_private_pool(
                block_pool, ckpt,
                make_pool=lambda n: BlockPool(n, block_pool.enable_caching,
                                              block_pool.hash_block_size),
                make_queue=FreeKVCacheBlockQueue, alias_ids=plan.d0_alias_ids)
            lo, hi = block_id_range(self.block_pool)
            resolved.update(attention_blocks=attn, checkpoint_blocks=ckpt,
                            d0_attn_fraction=plan.d0_attn_fraction,
                            checkpoint_block_ids=[lo, hi], alias_ids=plan.d0_alias_ids,
                            attention_block_tokens=kv_cache_spec.block_size,
                            checkpoint_interval_tokens=kv_cache_spec.block_size)
        else:
            layout = PageLayout(plan.org, ssm, conv, page // kv_cache_spec.block_size,
                                plan.grid_tokens)
            block_pool.org_setup(layout, alias_states=plan.state_alias_ids)
            if plan.state_alias_ids:
                place_states(block_pool)
            resolved.update(pages_per_checkpoint=layout.pages_per_checkpoint,
                            grid_page_bytes=layout.grid_page_bytes,
                            slab_slots=layout.slab_slots, slot_bytes=layout.slot_bytes,
                            alias_states=plan.state_alias_ids)
        emit(RESOLVED_TAG, resolved)

    # D0's checkpoint-pool headroom for the allocation under way (blocks kept
    # free after it), set by `PinningScheduler` around an admission.
    headroom_blocks = 0

    def get_num_blocks_to_allocate(self, *args, **kwargs) -> int:
        n = super().get_num_blocks_to_allocate(*args, **kwargs)
        if self.plan.org == "d0":
            # Its own pool: nothing from the shared one, or "cannot" when it
            # (with the admission's headroom) is full.
            if n + self.headroom_blocks <= self.block_pool.get_num_free_blocks():
                return 0
            return self.shared_pool.num_gpu_blocks + 1
        if n > self.block_pool.num_gpu_blocks:
            return n                    # vLLM's own "not this step" answer
        return self.block_pool.pages_needed(n)

    def allocate_new_blocks(self, *args, **kwargs):
        if self.plan.org == "d0":
            return super().allocate_new_blocks(*args, **kwargs)
        with self.block_pool.carrier_allocation():
            return super().allocate_new_blocks(*args, **kwargs)

    def counters(self) -> dict:
        if self.plan.org == "d0":
            return {"org": "d0", "checkpoint_free": self.block_pool.get_num_free_blocks(),
                    "checkpoint_blocks": len(self.block_pool.blocks) - 1,
                    "attention_free": self.shared_pool.get_num_free_blocks()}
        return self.block_pool.snapshot()


def place_states(pool: MemberPagesMixin) -> None:
    """S1's and S2's negative control: the block ids vLLM sends its worker
    name the page ``pool`` placed each checkpoint's state at
    (`MemberPagesMixin.placed_id`); the pool's own bookkeeping keeps the real
    ids (idempotent)."""
    original = KVCacheBlocks.get_block_ids
    if getattr(original, "_hbench", False):
        return

    def get_block_ids(self, allow_none=False, *, group_ids=None):
        ids = original(self, allow_none, group_ids=group_ids)
        if ids is None:
            return None
        return tuple([pool.placed_id(b) for b in group] for group in ids)

    get_block_ids._hbench = True
    KVCacheBlocks.get_block_ids = get_block_ids


def install(plan: Plan) -> None:
    """Redirect vLLM's pool and Mamba manager to the organization's (idempotent)."""
    global _PLAN
    _PLAN = plan
    if plan.org in ("s1", "s2"):
        coordinator_module.BlockPool = MemberPagesBlockPool
    if getattr(KVCacheSpecRegistry.get_manager_class, "_hbench", False):
        return
    original = KVCacheSpecRegistry.get_manager_class.__func__

    def get_manager_class(cls, kvcache_spec, role=None):
        manager = original(cls, kvcache_spec, role)
        return OrgMambaManager if manager is MambaManager else manager

    get_manager_class._hbench = True
    KVCacheSpecRegistry.get_manager_class = classmethod(get_manager_class)
