"""Prefix keys: chained block hashes at a fine 16-token granularity.

``keys[i]`` identifies the prefix covering tokens ``[0, 16 (i + 1))``: it is
the hash of (``keys[i - 1]``, the 16 token ids of block i), and the cache salt
is mixed into the seed of block 0, so two requests share a key exactly when
they share the whole prefix and the salt. Every organization's attention
block (512 or 16 tokens) and checkpoint grid (512 or 1792 tokens) is a
multiple of 16, so the key of a coarser block ending at token J is simply
``keys[J // 16 - 1]``: one list serves every organization.

Hashes are Python tuple hashes of ints (deterministic across processes; only
str/bytes hashing is randomized), with the salt reduced by crc32.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

KEY_TOKENS = 16


def salt_seed(salt: str | None) -> int:
    return 0 if salt is None else zlib.crc32(salt.encode()) + 1


def extend_keys(keys: list[int], tokens: Sequence[int], salt: str | None) -> None:
    """Append keys for every complete 16-token block of ``tokens`` not yet keyed."""
    first, stop = len(keys) * KEY_TOKENS, len(tokens) // KEY_TOKENS * KEY_TOKENS
    if stop <= first:
        return
    prev = keys[-1] if keys else salt_seed(salt)
    ids = tokens[first:stop]
    if not isinstance(ids, list):   # an array('q') or numpy slice: Python ints hash alike
        ids = ids.tolist()
    append = keys.append
    for i in range(0, stop - first, KEY_TOKENS):
        prev = hash((prev, *ids[i:i + KEY_TOKENS]))
        append(prev)


def chain_keys(tokens: Sequence[int], salt: str | None = None) -> list[int]:
    keys: list[int] = []
    extend_keys(keys, tokens, salt)
    return keys


class SharedPrefixKeys:
    """Prompt keys that reuse the keys of a shared context: requests of one
    prefix group (`workloads.workload.WorkloadRequest.prefix_group`) start with
    the same ``prefix_tokens`` token ids, whose keys are chained once per
    (salt, group). The memo checks that the ids really are the same, so it
    never changes a key; it only skips hashing them again."""

    def __init__(self):
        self._memo: dict[tuple, tuple[np.ndarray, list[int]]] = {}

    def chain(self, tokens: np.ndarray, salt: str | None, group: int,
              prefix_tokens: int) -> list[int]:
        """`chain_keys` of ``tokens`` (a numpy array of token ids)."""
        n = min(prefix_tokens, len(tokens)) // KEY_TOKENS * KEY_TOKENS
        if group < 0 or n == 0:
            return chain_keys(tokens, salt)
        prefix = tokens[:n]
        hit = self._memo.get((salt, group))
        if hit is None or not np.array_equal(hit[0], prefix):
            hit = self._memo[(salt, group)] = (prefix.copy(), chain_keys(prefix, salt))
        keys = list(hit[1])
        extend_keys(keys, tokens, salt)
        return keys


def key_at(keys: Sequence[int], position: int) -> int:
    """The key of the prefix ``[0, position)``; ``position`` a positive multiple of 16."""
    return keys[position // KEY_TOKENS - 1]
