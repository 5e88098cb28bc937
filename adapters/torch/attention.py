"""Causal attention over paged K/V blocks with an online (streaming) softmax.

The keys and values of a request's context ``[0, context_len)`` lie in a
page tensor, block ``j`` (positions ``[j * block, (j + 1) * block)``) in page
``block_table[j]``::

    kv_layer: [pages, 2 (K, V), block_tokens, kv_heads, head_dim]

Queries visit the blocks in order and keep, per query and head, a running
maximum ``m``, a running sum of ``exp(score - m)`` and an accumulator of
``exp(score - m) * v``. When a block raises the maximum, the old sum and
accumulator are rescaled by ``exp(m_old - m_new)``; after the last block
``acc / sum`` equals the softmax over the whole context exactly (up to
rounding), without ever holding more than one step of scores. A key at
position ``p`` is visible to a query at position ``t`` iff ``p <= t``
(causal), so one chunk of a chunked prefill sees every earlier chunk and the
chunk's own keys up to itself. A step may take several consecutive blocks at
once (`STEP_TOKENS`), so small blocks cost no more Python steps than large ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Keys one softmax step takes at most (whole blocks; at least one): 16-token
# blocks are visited 32 at a time, 512-token blocks one at a time.
STEP_TOKENS = 512


def _pages_per_step(block: int, step_tokens: int) -> int:
    return max(1, step_tokens // block)


def paged_attention(q: torch.Tensor, q_pos: torch.Tensor, kv_layer: torch.Tensor,
                    block_table: Sequence[int], context_len: int, scale: float,
                    step_tokens: int = STEP_TOKENS) -> torch.Tensor:
    """Attention of queries ``q [T, heads, head_dim]`` at positions ``q_pos [T]``.

    Query head ``h`` reads K/V head ``h // (heads // kv_heads)`` (grouped-query
    attention). Each softmax step takes as many whole blocks as fit in
    ``step_tokens`` (at least one). Returns ``[T, heads, head_dim]``.
    """
    T, H, D = q.shape
    block, kvh = kv_layer.shape[2], kv_layer.shape[3]
    g = H // kvh
    if context_len > block * len(block_table):
        raise ValueError(f"context of {context_len} tokens needs more than the "
                         f"{len(block_table)} blocks of {block} tokens in the block table")
    qg = (q * scale).reshape(T, kvh, g, D).permute(1, 2, 0, 3)  # [kvh, g, T, D]
    dev = q.device
    m = torch.full((kvh, g, T), float("-inf"), dtype=q.dtype, device=dev)
    total = torch.zeros((kvh, g, T), dtype=q.dtype, device=dev)
    acc = torch.zeros((kvh, g, T, D), dtype=q.dtype, device=dev)
    last_query = int(q_pos.max())
    per_step = _pages_per_step(block, step_tokens)
    for j in range(0, (context_len + block - 1) // block, per_step):
        first = j * block
        if first > last_query:       # every later key is in every query's future
            break
        pages = kv_layer[torch.as_tensor(list(block_table[j:j + per_step]), device=dev)]
        n = min(pages.shape[0] * block, context_len - first)
        k = pages[:, 0].reshape(-1, kvh, D)[:n]                # [n, kvh, D]
        v = pages[:, 1].reshape(-1, kvh, D)[:n]
        s = torch.einsum("hgtd,nhd->hgtn", qg, k)
        k_pos = torch.arange(first, first + n, device=dev)
        future = k_pos[None, :] > q_pos[:, None]              # [T, n]
        if bool(future.any()):
            s = s.masked_fill(future, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        # A query that has seen no visible key yet keeps m = -inf; shift by 0 there.
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - shift[..., None])
        rescale = torch.exp(m - shift)
        total = total * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + torch.einsum("hgtn,nhd->hgtd", p, v)
        m = m_new
    out = acc / total[..., None]
    return out.permute(2, 0, 1, 3).reshape(T, H, D)


def paged_decode_attention(q: torch.Tensor, q_pos: torch.Tensor, kv_layer: torch.Tensor,
                           tables: torch.Tensor, scale: float,
                           step_tokens: int = STEP_TOKENS) -> torch.Tensor:
    """One query per request, all requests at once: the same online softmax, batched.

    Request ``r``'s query ``q[r] [heads, head_dim]`` sits at position
    ``q_pos[r]`` and sees keys ``0 .. q_pos[r]``, block ``j`` in page
    ``tables[r, j]``. ``tables [b, blocks]`` is padded to the longest request
    with any valid page index: blocks wholly after a query are masked out.
    Whole pages are read; keys and values of slots past a request's position
    are masked out (scores to -inf, values to 0), so whatever those slots
    hold, even NaN from a poisoned pool, never reaches the result. Returns
    ``[b, heads, head_dim]``.
    """
    b, H, D = q.shape
    block, kvh = kv_layer.shape[2], kv_layer.shape[3]
    g = H // kvh
    n_blocks = int(q_pos.max()) // block + 1
    if n_blocks > tables.shape[1]:
        raise ValueError(f"position {int(q_pos.max())} needs more than the "
                         f"{tables.shape[1]} blocks of {block} tokens in the block tables")
    qg = (q * scale).view(b, kvh, g, D)
    dev = q.device
    m = torch.full((b, kvh, g), float("-inf"), dtype=q.dtype, device=dev)
    total = torch.zeros((b, kvh, g), dtype=q.dtype, device=dev)
    acc = torch.zeros((b, kvh, g, D), dtype=q.dtype, device=dev)
    per_step = _pages_per_step(block, step_tokens)
    for j in range(0, n_blocks, per_step):
        pages = kv_layer[tables[:, j:min(j + per_step, n_blocks)]]   # [b, p, 2, block, kvh, D]
        k = pages[:, :, 0].reshape(b, -1, kvh, D)
        v = pages[:, :, 1].reshape(b, -1, kvh, D)
        s = torch.einsum("bhgd,bnhd->bhgn", qg, k)
        future = (j * block + torch.arange(k.shape[1], device=dev))[None, :] > q_pos[:, None]
        s = s.masked_fill(future[:, None, None, :], float("-inf"))
        # a masked score weighs 0, but 0 x NaN is NaN: never-written slots count for nothing
        v = v.masked_fill(future[:, :, None, None], 0.0)
        # Block 0 holds position 0, visible to every query: m is finite from then on.
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new[..., None])
        rescale = torch.exp(m - m_new)
        total = total * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + torch.einsum("bhgn,bnhd->bhgd", p, v)
        m = m_new
    return (acc / total[..., None]).reshape(b, H, D)
