"""``--scheduler-cls adapters.vllm_plugin.scheduler.PinningScheduler``.

Pinning on preemption. vLLM frees a victim's blocks to the LRU free queue,
where they may be evicted before it resumes. The pin keeps the victim's
deepest *joint* hit alive: the Mamba checkpoint at block ``j`` (carrier,
members and slot) AND the attention blocks ``[0, j]`` of every attention
group; the checkpoint alone is not enough, since without its attention
blocks the resumed lookup finds no joint hit. The hit is found as the
resumed request will look for it (``find_longest_cache_hit`` over its block
hashes), and a pin is one extra reference per block, taken before vLLM frees
the victim and released once it runs again or finishes; it never releases a
reference it did not take.

D0's admission headroom is per pool, as the study's engine had it (DESIGN.md
section 4); vLLM's watermark counts the whole cache against the shared pool,
so `_per_pool_headroom` sets it from the attention pool and has the
checkpoint manager keep its own pool's share free. Retention
(`adapters.vllm_plugin.retention`) and the counters written to the log (see
`hooks.emit`) also live here: docs/engines.md, "hbench's vLLM plugin".
"""

from __future__ import annotations

import time
from collections import Counter

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.request import RequestStatus

from adapters.vllm_plugin.hooks import COUNTERS_TAG, OrgMambaManager, emit
from adapters.vllm_plugin.retention import Retention

EMIT_INTERVAL_S = 0.5


class PinningScheduler(Scheduler):
    """vLLM's scheduler plus pins on preemption and the plugin's counters."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pins: dict[str, list[tuple[object, list]]] = {}
        self.pin_counters: Counter = Counter()
        self._last_emit = 0.0
        self._last_payload = ""
        self.retention: Retention | None = None
        self._per_pool_headroom()

    def enable_retention(self, threshold: int) -> None:
        """Hold a running producer's states demanded by ``threshold`` or more
        arrived requests (DESIGN.md section 4); before the first request."""
        if self.requests:
            raise RuntimeError("retention must be enabled before requests arrive")
        mamba, _ = self._managers()
        if not mamba:
            raise RuntimeError("retention needs a Mamba KV-cache group")
        self.retention = Retention(threshold, mamba[0].block_pool)

    def add_request(self, request, *args, **kwargs):
        out = super().add_request(request, *args, **kwargs)
        if self.retention is not None:
            self.retention.arrived(request.block_hashes)
        return out

    def _managers(self):
        managers = self.kv_cache_manager.coordinator.single_type_managers
        mamba = [m for m in managers if isinstance(m, MambaManager)]
        attention = [m for m in managers if not isinstance(m, MambaManager)]
        return mamba, attention

    def _per_pool_headroom(self) -> None:
        """D0's headroom per pool (module docstring)."""
        mamba, _ = self._managers()
        fraction = self.scheduler_config.watermark
        if not (fraction > 0 and mamba and isinstance(mamba[0], OrgMambaManager)
                and mamba[0].plan.org == "d0"):
            return
        manager, cache = mamba[0], self.kv_cache_manager
        cache.watermark_blocks = int(fraction * manager.attention_blocks)
        checkpoint_headroom = int(fraction * manager.checkpoint_blocks)
        allocate = cache.allocate_slots

        def allocate_slots(request, *args, has_scheduled_reqs=True, **kwargs):
            admitting = has_scheduled_reqs and request.status in (RequestStatus.WAITING,
                                                                  RequestStatus.PREEMPTED)
            manager.headroom_blocks = checkpoint_headroom if admitting else 0
            try:
                return allocate(request, *args, has_scheduled_reqs=has_scheduled_reqs, **kwargs)
            finally:
                manager.headroom_blocks = 0

        cache.allocate_slots = allocate_slots

    def _preempt_request(self, request, *args, **kwargs):
        self._pin(request)
        if self.retention is not None:
            self.retention.release(request.request_id)
        return super()._preempt_request(request, *args, **kwargs)

    def _pin(self, request) -> None:
        rid = request.request_id
        if rid in self._pins:
            return
        coordinator = self.kv_cache_manager.coordinator
        found = coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        groups, hit_tokens = found[0], found[1]
        if hit_tokens <= 0:
            self.pin_counters["pins_without_checkpoint"] += 1
            return
        held = []
        for manager, blocks in zip(coordinator.single_type_managers, groups, strict=True):
            real = [b for b in blocks if not b.is_null]
            if real:
                manager.block_pool.touch(real)
                held.append((manager.block_pool, real))
        self._pins[rid] = held
        self.pin_counters["pins_taken"] += 1
        self.pin_counters["pinned_tokens_total"] += hit_tokens

    def _release_pins(self) -> None:
        for rid in list(self._pins):
            request = self.requests.get(rid)
            if request is not None and not request.is_finished() and \
                    request.status.name != "RUNNING":
                continue
            for pool, blocks in reversed(self._pins.pop(rid)):
                pool.free_blocks(list(reversed(blocks)))
            self.pin_counters["pins_released"] += 1

    def _count_resumes(self, out) -> None:
        """Per resumed request, the tokens it starts from (its prefix-cache hit:
        a preempted request restarts at 0, so what is computed when it is
        scheduled again came from the cache); pinned ones are counted apart."""
        cached = out.scheduled_cached_reqs
        for rid in cached.resumed_req_ids:
            hit = cached.num_computed_tokens[cached.req_ids.index(rid)]
            self.pin_counters["resumes"] += 1
            self.pin_counters["resumed_hit_tokens_total"] += hit
            if rid in self._pins:
                self.pin_counters["pinned_resumes"] += 1
                self.pin_counters["pinned_resumes_with_hit"] += int(hit > 0)
                self.pin_counters["pinned_resume_hit_tokens_total"] += hit

    def _retain(self, out) -> None:
        """Retention's view of the step: who was admitted from how deep a
        hit, which states running producers now have cached, who finished."""
        retention = self.retention
        for new in out.scheduled_new_reqs:
            retention.admitted(new.req_id, new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        for rid in cached.resumed_req_ids:
            retention.admitted(rid, cached.num_computed_tokens[cached.req_ids.index(rid)])
        mamba, _ = self._managers()
        blocks = mamba[0].req_to_blocks
        for request in self.running:
            retention.scan(request.request_id, blocks.get(request.request_id, ()))

    def _release_finished(self) -> None:
        for rid in list(self.retention.seen):
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                self.retention.release(rid)

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        self._count_resumes(out)
        if self.retention is not None:
            self._retain(out)
        self._release_pins()
        self._emit(force=False)
        return out

    def update_from_output(self, *args, **kwargs):
        out = super().update_from_output(*args, **kwargs)
        if self.retention is not None:
            self._release_finished()
        self._release_pins()
        self._emit(force=not self.has_unfinished_requests())
        return out

    def _emit(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_emit < EMIT_INTERVAL_S:
            return
        mamba, _ = self._managers()
        payload = dict(self.pin_counters, pins_held=len(self._pins))
        if mamba and isinstance(mamba[0], OrgMambaManager):
            payload.update(mamba[0].counters())
        if self.retention is not None:
            payload.update(self.retention.snapshot())
        payload["preemptions"] = int(payload.get("pins_taken", 0)
                                     + payload.get("pins_without_checkpoint", 0))
        text = repr(sorted(payload.items()))
        if text != self._last_payload:
            emit(COUNTERS_TAG, payload)
            self._last_payload = text
            self._last_emit = now
