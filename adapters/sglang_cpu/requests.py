"""One request's memory in SGLang's pools and tree, through its lifetime.

Runs inside the SGLang venv. `RequestMemory` is what hbench's SGLang
scheduler (`adapters.sglang_cpu.scheduler`) holds per running request, and
each method is the SGLang call sequence for one event:

    admit     match_prefix -> lock the matched node -> (evict) -> alloc the
              unmatched tokens' KV and one Mamba slot (the request's live state)
    grow      (evict) -> alloc KV for the next tokens (decode)
    finish    insert the sequence's KV with the request's Mamba slot -> unlock
              (SGLang frees KV another request inserted meanwhile; a node that
              already had a state keeps it, and the request's slot is freed)
    retract   free the request's own KV and Mamba slot -> unlock (SGLang's
              retraction without insertion; the request recomputes later)

SGLang decides what a match returns (the deepest node with a Mamba state),
and what ``evict`` frees in each pool; hbench only counts.
"""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)

from adapters.sglang_cpu.tree import TombstoneCount, key


class Memory:
    """SGLang's pools and tree, and the counters of what they did.

    Under SGLang's unified memory (``pools.unified``) the two sides draw on one
    region, so two of SGLang's rules differ from its dual pools, and both are
    followed here: a Mamba slot is free when SGLang's byte-coordinated view
    says so (``schedulable_available_size``: the slot-id count
    ``available_size`` does not see the bytes), and room is made with
    ``evict_for_alloc``, which lets evicted KV fund a state's bytes
    (``unified_radix_cache.py:697``; ``allocation.py:321`` for the slot,
    ``allocator/base.py:168`` for the KV), the slot first, as SGLang binds a
    request's slot before extending its KV."""

    def __init__(self, pools, tree):
        self.pools, self.tree = pools, tree
        self.kv = pools.allocator
        self.mamba = pools.req_to_token_pool.mamba_allocator
        self.unified = pools.unified is not None
        # KV tokens' worth of the shared region one new state takes: SGLang's
        # admission reserves it per admitted request (schedule_policy.py:689-714)
        self.slot_token_cost = int(self.kv.mamba_slot_full_token_cost()) if self.unified else 0
        self.evictions = 0
        self.evicted_kv_tokens = 0
        self.evicted_mamba_slots = 0
        self.mamba_in_use_peak = 0
        self.tombstones = TombstoneCount(tree)

    def match(self, token_ids):
        return self.tree.match_prefix(MatchPrefixParams(key=key(token_ids)))

    def _count(self, result) -> None:
        self.evictions += 1
        self.evicted_kv_tokens += result.num_tokens_evicted
        self.evicted_mamba_slots += result.mamba_num_evicted

    def mamba_free(self) -> int:
        """Mamba slots an allocation can take now."""
        if self.unified:
            return int(self.mamba.schedulable_available_size())
        return int(self.mamba.available_size())

    def make_room(self, tokens: int, slots: int) -> bool:
        """Evict what is short in each pool (SGLang's tree chooses what), then
        whether ``tokens`` KV tokens and ``slots`` Mamba slots are free."""
        if self.unified:
            return self._room_for_slots(slots) and self._room_for_tokens(tokens)
        short_kv = max(0, tokens - self.kv.available_size())
        short_mamba = max(0, slots - self.mamba.available_size())
        if short_kv or short_mamba:
            self._count(self.tree.evict(EvictParams(num_tokens=short_kv, mamba_num=short_mamba)))
        return self.kv.available_size() >= tokens and self.mamba.available_size() >= slots

    def _room_for_slots(self, slots: int) -> bool:
        short = max(0, slots - self.mamba_free())
        if short:
            self._count(self.tree.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=short)))
        return self.mamba_free() >= slots

    def _room_for_tokens(self, tokens: int) -> bool:
        short = max(0, tokens - self.kv.available_size())
        if short:
            self._count(self.tree.evict_for_alloc(EvictParams(num_tokens=short)))
        return self.kv.available_size() >= tokens

    def take(self, tokens: int):
        """One Mamba slot and ``tokens`` KV tokens for an admitted request,
        evicting first what is short: ``(slot, kv)`` (``kv`` None when
        ``tokens`` is 0), or None with nothing held if SGLang cannot."""
        if self.unified:
            # SGLang binds the slot first (alloc_req_slots), then extends the KV
            slot = self.mamba.alloc(1) if self._room_for_slots(1) else None
            if slot is None:
                return None
            if tokens and not self._room_for_tokens(tokens):
                self.mamba.free(slot)
                return None
        else:
            if not self.make_room(tokens, 1):
                return None
            slot = self.mamba.alloc(1)
            if slot is None:
                return None
        kv = self.kv.alloc(tokens) if tokens else None
        if tokens and kv is None:
            self.mamba.free(slot)
            return None
        return slot, kv

    def available_plus_evictable(self) -> int:
        """SGLang's ``rem_total_tokens`` before reservations: free KV plus the
        tree's evictable KV."""
        return int(self.kv.available_size() + self.tree.evictable_size())

    def mamba_slots_free_or_evictable(self) -> int:
        return int(self.mamba_free() + self.tree.mamba_evictable_size())

    def note_usage(self) -> None:
        in_use = self.pools.req_to_token_pool.mamba_pool.size - self.mamba.available_size()
        self.mamba_in_use_peak = max(self.mamba_in_use_peak, int(in_use))


class RequestMemory:
    """A running request's KV indices, Mamba slot and tree lock."""

    def __init__(self, memory: Memory):
        self.memory = memory
        self.prefix = torch.empty(0, dtype=torch.int64)   # the matched path's KV
        self.own: list[torch.Tensor] = []                # KV allocated for it
        self.slot = None
        self.lock = None
        self.matched = 0

    def admit(self, token_ids, match, new_tokens: int) -> bool:
        """Lock the matched node and allocate ``new_tokens`` KV tokens and a
        Mamba slot; False (nothing held) if SGLang's pools cannot, even after
        eviction."""
        m = self.memory
        self.matched = int(match.device_prefix_len)
        self.lock = m.tree.lock(match.last_device_node)
        taken = m.take(new_tokens)
        if taken is None:
            m.tree.unlock(self.lock)
            self.lock = None
            return False
        slot, kv = taken
        self.prefix = m.tree.path_device_indices(match.last_device_node).to(torch.int64)
        self.own = [kv] if new_tokens else []
        self.slot = slot
        m.note_usage()
        return True

    def grow(self, tokens: int) -> bool:
        m = self.memory
        if not m.make_room(tokens, 0):
            return False
        kv = m.kv.alloc(tokens)
        if kv is None:
            return False
        self.own.append(kv)
        return True

    def finish(self, token_ids) -> None:
        m = self.memory
        values = torch.cat([self.prefix, *(t.to(torch.int64) for t in self.own)])
        n = len(values)
        result = m.tree.insert(InsertParams(key=key(token_ids[:n]), value=values,
                                            mamba_value=self.slot, prev_prefix_len=self.matched))
        if result.mamba_exist:
            m.mamba.free(self.slot)
        m.tree.unlock(self.lock)
        self.own, self.slot, self.lock = [], None, None

    def retract(self) -> None:
        m = self.memory
        for t in self.own:
            m.kv.free(t)
        m.mamba.free(self.slot)
        m.tree.unlock(self.lock)
        self.own, self.slot, self.lock = [], None, None
