"""Retention inside vLLM: a running producer keeps its demanded states cached.

DESIGN.md section 4: while a producer request runs, its checkpoints whose
prefix at least ``threshold`` distinct requests demand are exempt from
release; once it finishes or is preempted, normal caching and pinning apply.
vLLM 0.32 has no such policy (``--prefix-cache-retention-interval`` spaces
decode-time states; it keeps nothing for demand). In ``align`` mode a
request's older states leave its block list as it moves on
(``MambaManager.remove_skipped_blocks``) and wait in the LRU free queue,
where a later allocation may evict them; a hold keeps one there out of it.

Demand is counted as hbench's scheduler counts it (`Scheduler.add`): per
prompt prefix, the distinct requests that have arrived whose prompt holds
it, keyed by vLLM's chained block hash (equal hashes, equal prefixes).

A hold is one reference on the state's block, taken the first time the block
is seen cached in the producer's Mamba block list beyond the tokens it
adopted at admission (a state it computed, not one it hit), and given back
when the producer finishes or is preempted. On S1/S2 the block is a carrier,
so its member pages and slab slot follow (`MemberPagesMixin.touch`); on D0
it lives in the private checkpoint pool. Holds are apart from pins: each
gives back only the references it took, so neither releases the other's.
"""

from __future__ import annotations

from collections import Counter

#: the per-run setting a served vLLM's plugin would read; in process
#: `PinningScheduler.enable_retention` is called instead
ENV_RETENTION_THRESHOLD = "HBENCH_RETENTION_THRESHOLD"


def prefix_key(block_hash) -> bytes:
    """The prefix a cached block holds, without its KV-cache group: vLLM's
    ``BlockHashWithGroupId`` is the chained hash followed by a 4-byte group id
    (`vllm.v1.core.kv_cache_utils.make_block_hash_with_group_id`)."""
    return bytes(block_hash)[:-4]


class Retention:
    """Demand counts and the holds of running producers (module docstring).

    ``pool`` is the block pool the Mamba states live in; it needs vLLM's
    ``touch(blocks)`` and ``free_blocks(blocks)``."""

    def __init__(self, threshold: int, pool):
        if threshold < 1:
            raise ValueError(f"retention threshold must be >= 1, got {threshold}")
        self.threshold = threshold
        self.pool = pool
        self.demand: Counter[bytes] = Counter()
        self.held: dict[str, list] = {}          # producer -> blocks it holds
        self.seen: dict[str, set[bytes]] = {}    # producer -> states examined (hashes)
        self.adopted: dict[str, int] = {}        # producer -> tokens hit at admission
        self.counters: Counter = Counter()

    def arrived(self, block_hashes) -> None:
        """A request arrived with the prompt block hashes ``block_hashes``."""
        for h in set(block_hashes):
            self.demand[bytes(h)] += 1

    def admitted(self, request_id: str, hit_tokens: int) -> None:
        """``request_id`` was scheduled from waiting, ``hit_tokens`` from the cache."""
        self.adopted[request_id] = hit_tokens

    def scan(self, request_id: str, blocks) -> None:
        """Hold each newly cached state in a running producer's block list
        whose prefix meets the demand threshold."""
        seen = self.seen.setdefault(request_id, set())
        floor = self.adopted.get(request_id, 0)
        for block in blocks:
            if block.is_null or block.block_hash is None or block.block_hash in seen:
                continue
            seen.add(block.block_hash)
            if (block.block_hash_num_tokens or 0) <= floor:
                continue                         # a state it adopted, not one it made
            if self.demand[prefix_key(block.block_hash)] < self.threshold:
                continue
            self.pool.touch([block])
            self.held.setdefault(request_id, []).append(block)
            self.counters["retention_holds_taken"] += 1
        self.counters["retention_held_peak"] = max(self.counters["retention_held_peak"],
                                                   self.holding())

    def release(self, request_id: str) -> None:
        """``request_id`` finished or was preempted: its holds end."""
        blocks = self.held.pop(request_id, [])
        if blocks:
            self.pool.free_blocks(list(reversed(blocks)))
            self.counters["retention_holds_released"] += len(blocks)
        self.seen.pop(request_id, None)
        self.adopted.pop(request_id, None)

    def holding(self) -> int:
        return sum(len(b) for b in self.held.values())

    def snapshot(self) -> dict:
        return {**self.counters, "retention_threshold": self.threshold,
                "retention_held": self.holding()}
