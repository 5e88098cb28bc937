"""SGLang's radix cache (``UnifiedRadixCache`` with its FULL and MAMBA
components) over `adapters.sglang_cpu.pools`, and the calls hbench makes on it.

Runs inside the SGLang venv. SGLang's tree decides everything here: what a
match returns (the deepest node whose Mamba state is present: a longer KV
match without a state there is truncated), which nodes an insert creates,
what ``evict`` frees in each pool (KV tokens, Mamba slots; a node whose
Mamba state it frees while the KV stays is SGLang's tombstone). hbench only calls it,
in the order SGLang's scheduler does for a request without chunking
(``match_prefix`` at admission, ``lock`` of the matched node while the
request runs, allocation of its new tokens and one Mamba slot, ``insert``
of the whole sequence with the request's Mamba slot when it finishes, then
``unlock``), and counts what SGLang reports.

Two things SGLang needs that a server would set up (both documented in
docs/engines.md):
- the Mamba component asserts ``page_size == 1`` without the extra (ping-pong)
  buffer (``mem_cache/unified_cache/components/mamba.py:78``), so the dual
  pools run at page size 1, SGLang's default for Mamba hybrids;
- the component reads ``mamba_cache_chunk_size()`` from the process's published
  ``ServerArgs`` (``runtime_context.py:1028``, ``components/mamba.py:82``);
  `publish_server_args` publishes a ``ServerArgs`` with the pre-seeded chunk size
  that SGLang's own fixtures use (``arg_groups/overrides.py:1901``), so no model
  config is loaded.
"""

from __future__ import annotations

from array import array

from adapters.sglang_cpu.stubs import install

install()

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    ServerArgs,
    set_global_server_args_for_scheduler,
)


def publish_server_args(page_size: int) -> None:
    """The process-wide ``ServerArgs`` SGLang's Mamba component reads. Its
    model path is ``dummy``, which SGLang's argument resolution treats as no
    checkpoint (a real name would be looked up on the hub)."""
    args = ServerArgs(model_path="dummy", page_size=page_size)
    args._mamba_cache_chunk_size = page_size
    set_global_server_args_for_scheduler(args)


def build_tree(pools) -> UnifiedRadixCache:
    """SGLang's radix cache over ``pools`` (FULL + MAMBA components, LRU)."""
    publish_server_args(pools.page_size)
    return UnifiedRadixCache(CacheInitParams(
        disable=False, req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.allocator, page_size=pools.page_size,
        tree_components=(ComponentType.FULL, ComponentType.MAMBA)))


class TombstoneCount:
    """How many nodes SGLang's eviction tombstoned: freed their Mamba state
    while keeping their KV (an internal node another path still needs).

    SGLang reports evicted KV tokens and Mamba states, not tombstones; its
    eviction walk does say, per step (``UnifiedTreeCoreInterface``'s
    ``EvictDeviceNextNodeResult``): a step that made progress without handing
    back a leaf to evict was an internal tombstone. The walk's step is
    ``UnifiedRadixCache._evict_device_next_node`` (sglang 0.5.23, pinned by
    scripts/setup_sglang_cpu.sh), which returns ``(leaf or None, made
    progress)``; this wraps it on one tree object and counts those steps."""

    def __init__(self, tree: UnifiedRadixCache):
        self.count = 0
        step = tree._evict_device_next_node

        def counted(component_type, tracker):
            leaf, progressed = step(component_type, tracker)
            if leaf is None and progressed and component_type == ComponentType.MAMBA:
                self.count += 1
            return leaf, progressed

        tree._evict_device_next_node = counted


def key(token_ids) -> RadixKey:
    """A radix key over ``token_ids`` (SGLang's tree takes 8-byte ``array('q')``)."""
    return RadixKey(array("q", token_ids), None)


class TreeDriver:
    """Serves requests one at a time through SGLang's tree and pools, and
    counts what SGLang reports: matched tokens per request, evictions and the
    KV tokens and Mamba slots they freed, the peak of Mamba slots in use."""

    def __init__(self, pools, tree: UnifiedRadixCache):
        self.pools, self.tree = pools, tree
        self.kv_alloc = pools.allocator
        self.mamba_alloc = pools.req_to_token_pool.mamba_allocator
        self.matched: list[int] = []
        self.branching: list[int] = []     # SGLang's mamba_branching_seqlen per request
        self.evicted_kv_tokens = 0
        self.evicted_mamba_slots = 0
        self.evictions = 0
        self.mamba_in_use_peak = 0
        self.tombstones = TombstoneCount(tree)

    def _make_room(self, tokens: int) -> bool:
        """SGLang's rule when an allocation does not fit: evict from the tree
        what is short in each pool, then allocate (``evict_for_alloc``'s shape)."""
        short_kv = max(0, tokens - self.kv_alloc.available_size())
        short_mamba = max(0, 1 - self.mamba_alloc.available_size())
        if short_kv or short_mamba:
            result = self.tree.evict(EvictParams(num_tokens=short_kv, mamba_num=short_mamba))
            self.evictions += 1
            self.evicted_kv_tokens += result.num_tokens_evicted
            self.evicted_mamba_slots += result.mamba_num_evicted
        return (self.kv_alloc.available_size() >= tokens
                and self.mamba_alloc.available_size() >= 1)

    def serve(self, token_ids: list[int]) -> int:
        """One request over ``token_ids`` (prompt plus output): match, lock,
        allocate the unmatched tokens and a Mamba slot, insert, unlock. Returns
        the tokens SGLang matched (J_adopt); -1 if the pools cannot hold it."""
        match = self.tree.match_prefix(MatchPrefixParams(key=key(token_ids)))
        matched = match.device_prefix_len
        self.branching.append(int(match.mamba_branching_seqlen or 0))
        lock = self.tree.lock(match.last_device_node)
        new = len(token_ids) - matched
        if not self._make_room(new):
            self.tree.unlock(lock)
            return -1
        prefix = self.tree.path_device_indices(match.last_device_node)
        kv = self.kv_alloc.alloc(new)
        state = self.mamba_alloc.alloc(1)
        in_use = self.pools.req_to_token_pool.mamba_pool.size - self.mamba_alloc.available_size()
        self.mamba_in_use_peak = max(self.mamba_in_use_peak, int(in_use))
        values = torch.cat([prefix.to(torch.int64), kv.to(torch.int64)])
        result = self.tree.insert(InsertParams(key=key(token_ids), value=values,
                                               mamba_value=state,
                                               prev_prefix_len=matched))
        # KV another request inserted meanwhile over [matched, prefix_len) is
        # freed by SGLang's insert itself (prev_prefix_len marks ours)
        if result.mamba_exist:               # the node had a state: ours is surplus
            self.mamba_alloc.free(state)
        self.tree.unlock(lock)
        self.matched.append(int(matched))
        return int(matched)

    def check_idle(self) -> None:
        """With no request in flight every KV token and every Mamba slot is free
        or held by the tree (SGLang's ``total_size``: KV tokens, Mamba slots)."""
        kv, mamba = self.tree.total_size()
        free_kv, free_mamba = self.kv_alloc.available_size(), self.mamba_alloc.available_size()
        size_kv, size_mamba = self.pools.kv_pool.size, self.pools.req_to_token_pool.mamba_pool.size
        if self.pools.unified is not None:
            # one region whose sides float: the tree's KV and states fit in it
            held = kv * self.pools.entry_bytes[0] + mamba * self.pools.entry_bytes[1]
            assert held <= self.pools.unified.total_bytes, (
                "unified", kv, mamba, held, self.pools.unified.total_bytes)
            return
        assert free_kv + kv == size_kv, ("kv", free_kv, kv, size_kv)
        assert free_mamba + mamba == size_mamba, ("mamba", free_mamba, mamba, size_mamba)

    def counters(self) -> dict:
        """SGLang's served-state counters so far."""
        mamba = self.pools.req_to_token_pool.mamba_pool
        return {
            "requests": len(self.matched),
            "matched_tokens": int(sum(self.matched)),
            "requests_matched": sum(1 for m in self.matched if m > 0),
            # KV SGLang's match walked past for want of a Mamba state at its end
            "truncated_tokens": int(sum(max(0, b - m)
                                        for b, m in zip(self.branching, self.matched, strict=True))),
            "evictions": self.evictions,
            "evicted_kv_tokens": self.evicted_kv_tokens,
            "evicted_mamba_slots": self.evicted_mamba_slots,
            "tombstoned_nodes": self.tombstones.count,
            "mamba_slots_in_use_peak": self.mamba_in_use_peak,
            "mamba_slots": int(mamba.size),
            "tree_evictable_tokens": int(self.tree.evictable_size()),
        }
