"""What a preemption pin covers (pure; tested without vLLM).

The joint hit rule: a prefix of ``j + 1`` blocks is reusable only if every
attention group holds cached blocks ``[0, j]`` and the Mamba group holds a
cached state at block ``j``. `joint_depth` finds the deepest such ``j`` on a
request's own block lists, so the pin keeps exactly what a resumed lookup
needs.
"""

from __future__ import annotations

from collections.abc import Sequence


def _cached(block) -> bool:
    return not block.is_null and block.block_hash is not None


def joint_depth(mamba_blocks: Sequence, attention_blocks: Sequence[Sequence]) -> int | None:
    """Deepest block index ``j`` with a cached Mamba state at ``j`` and cached
    attention blocks ``[0, j]`` in every attention group; None if there is none."""
    valid_attention = len(mamba_blocks)
    for blocks in attention_blocks:
        n = 0
        while n < len(blocks) and _cached(blocks[n]):
            n += 1
        valid_attention = min(valid_attention, n)
    for j in range(valid_attention - 1, -1, -1):
        if _cached(mamba_blocks[j]):
            return j
    return None
