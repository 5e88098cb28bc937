"""Driving an organization by hand, through its public protocol only
(`harness.orgs.protocol`), as the scheduler would."""

from __future__ import annotations

from harness.orgs.keys import chain_keys


def tokens(n: int, base: int = 0) -> list[int]:
    """``n`` distinct token ids from ``base``: prompts that share nothing unless asked to."""
    return list(range(base, base + n))


def serve(org, rid: int, toks: list[int], salt=None) -> tuple[list, list[int]]:
    """Admit ``toks`` (with whatever prefix the organization holds), compute the
    whole prompt in one chunk and finish, checking the invariants after; returns
    the prompt's keys and the positions it published."""
    keys = chain_keys(toks, salt)
    hit = org.lookup(keys, len(toks) - 1)
    assert org.allocate(rid, len(toks), len(toks), keys, hit)
    published = org.commit(rid, keys, len(toks), len(toks))
    org.finish(rid)
    org.check_invariants()
    return keys, published
