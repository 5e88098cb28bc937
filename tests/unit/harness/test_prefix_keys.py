"""Prefix keys: `extend_keys` on any sequence type, and `SharedPrefixKeys`
giving exactly `chain_keys` whether or not its memo hits."""

from array import array

import numpy as np

from harness.orgs.keys import SharedPrefixKeys, chain_keys, extend_keys


def reference_keys(tokens, salt=None) -> list[int]:
    """The definition, block by block."""
    from harness.orgs.keys import salt_seed
    prev, out = salt_seed(salt), []
    for i in range(len(tokens) // 16):
        prev = hash((prev, *[int(t) for t in tokens[16 * i:16 * (i + 1)]]))
        out.append(prev)
    return out


def test_extend_keys_agrees_for_lists_arrays_and_numpy():
    ids = [(7 * i * i + 3) % 50_000 for i in range(200)]
    want = reference_keys(ids, "s")
    for seq in (ids, array("q", ids), np.array(ids, dtype=np.int64)):
        assert chain_keys(seq, "s") == want
        keys = chain_keys(seq[:40], "s")       # two keys, then the rest
        extend_keys(keys, seq, "s")
        assert keys == want


def test_shared_prefix_keys_equal_chain_keys():
    rng = np.random.default_rng(0)
    context = rng.integers(0, 50_000, 100, dtype=np.int64)      # 6 whole blocks + 4 tokens
    memo = SharedPrefixKeys()
    for salt in (None, "a"):
        for turn_len in (5, 37, 0):
            tokens = np.concatenate([context, rng.integers(0, 50_000, turn_len)])
            assert memo.chain(tokens, salt, 3, len(context)) == chain_keys(tokens, salt)
    # the same group with different ids (a stale memo entry) is not trusted
    other = context.copy()
    other[20] += 1
    tokens = np.concatenate([other, [1, 2, 3]])
    assert memo.chain(tokens, None, 3, len(other)) == chain_keys(tokens)
    assert memo.chain(tokens, None, -1, 0) == chain_keys(tokens)
    assert memo.chain(tokens[:10], None, 3, len(other)) == chain_keys(tokens[:10]) == []
