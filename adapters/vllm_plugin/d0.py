"""D0 inside vLLM: a private checkpoint pool whose block ids never alias attention's.

vLLM 0.32 lays every KV-cache group over the same bytes from byte 0
(``get_kv_cache_config_from_groups`` in ``vllm/v1/core/kv_cache_utils.py``):
block id ``b`` of the attention group and block id ``b`` of the Mamba group
are the same memory. Two pools that each numbered their blocks from 1 would
therefore write Mamba states over attention KV. `carve_private_pool` gives the
checkpoint pool the *top* ``checkpoint_blocks`` ids of the shared pool (taken
out of the shared free queue for good), so the two pools occupy disjoint byte
ranges of the one tensor: a separate byte region without touching the worker.

``alias_ids=True`` is the negative control: the private pool numbers its own
blocks from 1, as a naive private pool would, so its ids are attention's ids.
The capacities are the same; only the byte placement differs, and outputs
are corrupted.
"""

from __future__ import annotations

from collections.abc import Callable


def carve_private_pool(shared, checkpoint_blocks: int, make_pool: Callable[[int], object],
                       make_queue: Callable[[list], object], alias_ids: bool = False):
    """A pool of ``checkpoint_blocks`` blocks for the checkpoint manager.

    ``make_pool(n)`` builds an empty pool of ``n`` blocks (block 0 its null
    block); ``make_queue(blocks)`` a free queue over ``blocks``. The shared
    pool loses its top ``checkpoint_blocks`` ids either way.
    """
    n = shared.num_gpu_blocks
    if not 0 < checkpoint_blocks < n - 1:
        raise ValueError(f"cannot carve {checkpoint_blocks} of {n} blocks for checkpoints")
    reserved = [shared.blocks[i] for i in range(n - checkpoint_blocks, n)]
    for block in reserved:
        assert block.ref_cnt == 0 and block.block_hash is None, (
            f"block {block.block_id} is in use (ref {block.ref_cnt}) before the split")
        shared.free_block_queue.remove(block)
    private = make_pool(checkpoint_blocks + 1)
    if alias_ids:
        return private          # ids 1..checkpoint_blocks: the attention pool's own ids
    for block in reserved:
        block.pool = private
    private.blocks = [shared.null_block, *reserved]
    private.free_block_queue = make_queue(reserved)
    private.null_block = shared.null_block
    return private


def block_id_range(pool) -> tuple[int, int]:
    """(lowest, highest) non-null block id a pool hands out."""
    ids = [b.block_id for b in pool.blocks if not b.is_null]
    return min(ids), max(ids)
