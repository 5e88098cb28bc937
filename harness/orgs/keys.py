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

KEY_TOKENS = 16


def salt_seed(salt: str | None) -> int:
    return 0 if salt is None else zlib.crc32(salt.encode()) + 1


def extend_keys(keys: list[int], tokens: Sequence[int], salt: str | None) -> None:
    """Append keys for every complete 16-token block of ``tokens`` not yet keyed."""
    prev = keys[-1] if keys else salt_seed(salt)
    for i in range(len(keys), len(tokens) // KEY_TOKENS):
        prev = hash((prev, *tokens[i * KEY_TOKENS:(i + 1) * KEY_TOKENS]))
        keys.append(prev)


def chain_keys(tokens: Sequence[int], salt: str | None = None) -> list[int]:
    keys: list[int] = []
    extend_keys(keys, tokens, salt)
    return keys


def key_at(keys: Sequence[int], position: int) -> int:
    """The key of the prefix ``[0, position)``; ``position`` a positive multiple of 16."""
    return keys[position // KEY_TOKENS - 1]
